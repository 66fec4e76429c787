"""A run folder's record of the command line that started the run, and the command line that resumes it.

Hydra writes a run's overrides to <run folder>/.hydra/overrides.yaml as it starts. `resume=auto hydra.run.dir=<folder>`
alone must train that run on: `restored` puts the recorded overrides, and those given to earlier resumes (kept in
.hydra/resumes.yaml), before the ones on the command line, so the ones given now apply on top, and tells Hydra not
to write its record again (`hydra.output_subdir=null`): the record stays the run's own.
"""
import os
import shlex
import sys
from pathlib import Path

import psutil
import yaml
from hydra._internal.utils import get_args_parser

from .resolvers import NO_RENDEZVOUS_ID
from .files import write_atomic

PACKAGE = "{{ cookiecutter.package }}"
RECORD, RESUMES = Path(".hydra/overrides.yaml"), Path(".hydra/resumes.yaml")
# Keys that say what one command does, not what the run is: where it stops (train.max_steps cuts a run short, and
# its resume goes on past that), the faults a test injects, the folder and the resume itself. Never restored.
THIS_COMMAND = ("train.max_steps", "faults.", "hydra.", "resume")
restored_note: str | None = None  # what `restored` restored in this process, for train.py to log once logging is set up
# What `restored` would add to the folder's list of resumes, written by `keep_resume` once the config is accepted:
# a value the run refuses must not come back at the next resume.
pending_resume: tuple[Path, list[list[str]]] | None = None


def key_of(override: str) -> str:
    """The config key an override sets: `model.name` for `model.name=x`, `+model.name=x` and `~model.name`."""
    return override.lstrip("~+").split("=", 1)[0]


def value_of(overrides: list[str], key: str) -> str | None:
    return next((override.split("=", 1)[1] for override in reversed(overrides) if key_of(override) == key
                 and "=" in override), None)


def settings(overrides: list[str]) -> dict[str, str]:
    """What `overrides` set, whatever their order: each key's last override, as Hydra applies them, leaving out the
    keys of THIS_COMMAND."""
    return {key_of(override): override for override in overrides if not key_of(override).startswith(THIS_COMMAND)}


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """A command line's Hydra flags (--config-dir mine, ...) and its overrides."""
    overrides = get_args_parser().parse_args(argv[1:]).overrides
    return [arg for arg in argv[1:] if arg not in overrides], overrides


def restored(argv: list[str]) -> tuple[list[str], str | None]:
    """`argv` with the overrides its resumed run was started and resumed with put before its own, and a line that says
    which were restored; `argv` as it is, and None, where it resumes no run with a record."""
    flags, given = split(argv)
    folder = value_of(given, "hydra.run.dir")
    if value_of(given, "resume") is None or folder is None or not (Path(folder) / RECORD).is_file():
        return argv, None
    folder = Path(folder)
    resumes = folder / RESUMES
    resumed = yaml.safe_load(resumes.read_text()) if resumes.is_file() else []
    earlier = [override for override in [*yaml.safe_load((folder / RECORD).read_text()),
                                         *(override for given in resumed for override in given)]
               if not key_of(override).startswith(THIS_COMMAND)]
    now = {key_of(override) for override in given}
    latest = {key_of(override): override for override in earlier if key_of(override) not in now}  # last one wins
    kept = [override for override in earlier if latest.get(key_of(override)) == override]
    global pending_resume
    pending_resume = resumes, [*resumed, [override for override in given
                                          if not key_of(override).startswith(THIS_COMMAND)]]
    note = (f"resume: the run's own overrides from {folder / RECORD}: {' '.join(kept) or 'none'}; given now: "
            f"{' '.join(given)}")
    return [argv[0], *flags, *kept, *given, "hydra.output_subdir=null"], note


def another_run(argv: list[str]) -> str | None:
    """Why this torchrun job must not start, or None. Its folder, outputs/torchrun-<rendezvous id>, is resumed by the
    job that restarts there: by torchrun's restarts, and by a node that joins the job again (whose restart count
    starts at 0), with the job's own command line. Another job given the same id with other overrides would go on
    from the first run's weights under its own settings, and write over its record."""
    _, given = split(argv)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", NO_RENDEZVOUS_ID)
    if (run_id == NO_RENDEZVOUS_ID or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0
            or value_of(given, "resume") is not None or value_of(given, "hydra.run.dir") is not None):
        return None
    folder = Path("outputs") / f"torchrun-{run_id}"
    if not (folder / RECORD).is_file():
        return None
    recorded = [override for override in yaml.safe_load((folder / RECORD).read_text())
                if not key_of(override).startswith(THIS_COMMAND)]
    if settings(recorded) == settings(given):
        return None
    started = " ".join(recorded) or "no overrides"
    return (f"{folder} holds another run of rendezvous id {run_id}, started with {started}: give this job an id of "
            f"its own (--rdzv-id, or RDZV_ID of scripts/launch.sh), or carry that run on with resume=auto "
            f"hydra.run.dir={folder}")


def keep_resume() -> None:
    """Add the overrides given to this resume to the folder's list (rank 0 alone), for the next resume to restore."""
    if pending_resume is not None and int(os.environ.get("RANK", 0)) == 0:
        resumes, listed = pending_resume
        write_atomic(resumes, lambda path: path.write_text(yaml.safe_dump(listed)))


def resume_command(run_dir: Path) -> str:
    """The command line that carries the run in `run_dir` on from its checkpoint, as this one was launched: under
    torchrun, torchrun's own command line (this process's parent's)."""
    launched = [sys.executable, "-m", f"{PACKAGE}.train"]
    if "TORCHELASTIC_RUN_ID" in os.environ:
        agent = psutil.Process(os.getppid()).cmdline()
        launched = agent[:agent.index(f"{PACKAGE}.train") + 1] if f"{PACKAGE}.train" in agent else launched
    return shlex.join([*launched, *split(sys.argv)[0], "resume=auto", f"hydra.run.dir={run_dir}"])
