"""The run folder's record: `resume=auto hydra.run.dir=<folder>` composes the run's own overrides again, those given
now on top, and never writes over the record; the line a stopped run prints is the command that resumes it."""
import sys

import pytest
import yaml

from {{ cookiecutter.package }}.core import record
from {{ cookiecutter.package }}.core.errors import ConfigError


@pytest.fixture(autouse=True)
def no_resume_left_behind(monkeypatch):
    """What restored() notes for this process goes with the test: a later in-process run would otherwise write its
    resumes.yaml into this test's folder, which is gone by then."""
    monkeypatch.setattr(record, "pending_resume", None)
    monkeypatch.setattr(record, "restored_note", None)


def test_a_resume_restores_the_runs_overrides_under_the_ones_given_with_it(tmp_path, monkeypatch):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    started = ["data=folder", "data.root=/photos", "model.name=resnet18", "train.epochs=3", "experiment=cpu_quick"]
    (run / ".hydra/overrides.yaml").write_text(yaml.safe_dump(started))
    argv, note = record.restored(["train.py", "--config-dir", "mine", "resume=auto", f"hydra.run.dir={run}",
                                  "train.epochs=5"])
    assert argv == ["train.py", "--config-dir", "mine", "data=folder", "data.root=/photos", "model.name=resnet18",
                    "experiment=cpu_quick", "resume=auto", f"hydra.run.dir={run}", "train.epochs=5",
                    "hydra.output_subdir=null"]
    assert note.endswith("given now: resume=auto hydra.run.dir=" + str(run) + " train.epochs=5")
    assert yaml.safe_load((run / ".hydra/overrides.yaml").read_text()) == started  # the record stays the run's own

    assert not (run / ".hydra/resumes.yaml").exists()  # not before the config is accepted
    record.keep_resume()
    again, _ = record.restored(["train.py", "resume=auto", f"hydra.run.dir={run}"])  # epochs=5 is the run's now
    record.keep_resume()
    assert "train.epochs=5" in again and "train.epochs=3" not in again
    monkeypatch.setenv("RANK", "1")  # another rank of the job reads the record, and leaves writing it to rank 0
    record.restored(["train.py", "resume=auto", f"hydra.run.dir={run}", "optim.lr=0.01"])
    record.keep_resume()
    assert yaml.safe_load((run / ".hydra/resumes.yaml").read_text()) == [["train.epochs=5"], []]


def test_a_command_line_that_resumes_nothing_recorded_is_left_as_it_is(tmp_path):
    plain = ["train.py", "model.name=resnet18"]
    assert record.restored(plain) == (plain, None)
    elsewhere = ["train.py", "resume=auto", f"hydra.run.dir={tmp_path / 'new'}"]  # no record there: a fresh run
    assert record.restored(elsewhere) == (elsewhere, None)


def test_the_line_a_stopped_run_prints_resumes_it_as_it_was_launched(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setattr(sys, "argv", ["train.py", "--config-dir", "my conf", "data=folder"])
    assert record.resume_command(tmp_path / "run") == (
        f"{sys.executable} -m {record.PACKAGE}.train --config-dir 'my conf' resume=auto hydra.run.dir={tmp_path}/run")


def test_what_one_command_does_is_not_restored(tmp_path):
    """A run cut short by train.max_steps resumes past it; a fault injected into one command stays in that one."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra/overrides.yaml").write_text(yaml.safe_dump(["train.max_steps=4", "train.epochs=2",
                                                               "faults.worker_error_at=40"]))
    argv, _ = record.restored(["train.py", "resume=auto", f"hydra.run.dir={run}", "faults.sigterm_at=9"])
    assert argv == ["train.py", "train.epochs=2", "resume=auto", f"hydra.run.dir={run}", "faults.sigterm_at=9",
                    "hydra.output_subdir=null"]
    again, _ = record.restored(["train.py", "resume=auto", f"hydra.run.dir={run}"])
    assert again == ["train.py", "train.epochs=2", "resume=auto", f"hydra.run.dir={run}", "hydra.output_subdir=null"]


def test_a_resume_refused_as_the_run_is_built_is_left_out_of_the_record(train_in_process, tmp_path, monkeypatch):
    """train.ema_decay=1 passes the config's checks and is refused as the run is built: it must not come back at the
    next resume, which would then be refused for a key the user no longer typed."""
    resumes = tmp_path / "resumes.yaml"
    monkeypatch.setattr(record, "pending_resume", (resumes, [["train.ema_decay=1"]]))
    with pytest.raises(ConfigError, match="train.ema_decay=1"):
        train_in_process("train.ema_decay=1")
    assert not resumes.exists()
    monkeypatch.setattr(record, "pending_resume", (resumes, [["train.epochs=2"]]))
    train_in_process("train.epochs=2", "train.max_steps=1")
    assert yaml.safe_load(resumes.read_text()) == [["train.epochs=2"]]


def test_a_torchrun_job_whose_folder_holds_another_run_is_refused_and_the_same_job_goes_on(tmp_path, monkeypatch):
    """outputs/torchrun-<id> is resumed by the job that restarts in it; a job given that id with other overrides is
    refused before Hydra writes over the run's record."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "outputs/torchrun-exp1"
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra/overrides.yaml").write_text(yaml.safe_dump(["data=folder", "train.epochs=3"]))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "exp1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert record.another_run(["train.py", "data=folder", "train.epochs=5"]) == (
        "outputs/torchrun-exp1 holds another run of rendezvous id exp1, started with data=folder train.epochs=3: give "
        "this job an id of its own (--rdzv-id, or RDZV_ID of scripts/launch.sh), or carry that run on with "
        "resume=auto hydra.run.dir=outputs/torchrun-exp1")
    same_job = ["train.py", "data=folder", "train.epochs=3", "train.max_steps=9"]  # a node joining its job again
    assert record.another_run(same_job) is None
    assert record.another_run(["train.py", "train.epochs=5", "resume=auto"]) is None  # asked to carry it on
    in_another_order = ["train.py", "train.epochs=3", "train.epochs=4", "data=folder", "train.epochs=3"]
    assert record.another_run(in_another_order) is None  # the same settings: each key's last value
    assert record.another_run(["train.py", "train.epochs=3", "data=folder", "train.epochs=4"]) is not None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # torchrun restarting its own workers
    assert record.another_run(["train.py", "train.epochs=5"]) is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "exp2")  # a folder of its own
    assert record.another_run(["train.py", "train.epochs=5"]) is None
