"""A real Slurm on this machine: munged, slurmctld and slurmd (Debian's slurm-wlm) on 127.0.0.1, one node with this
machine's cores, started for the tests and torn down after. Its files, its ports and its munge key are its own, so
that it neither meets nor disturbs a Slurm the machine may run."""
import os
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from helpers.processes import wait_for

INSTALL = "apt-get install slurmctld slurmd slurm-client munge"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel")
SBIN = ("/usr/sbin", "/sbin")  # where Debian puts the daemons, off a plain user's PATH

CONF = """\
ClusterName=tests
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
JobRequeue=1
KillWait=30
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=tests Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def path_with_sbin() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), *SBIN])


def unavailable() -> str | None:
    """Why a real Slurm cannot start here, or None."""
    absent = [name for name in PROGRAMS if shutil.which(name, path=path_with_sbin()) is None]
    if absent:
        return f"a real Slurm needs {', '.join(absent)}, not found: {INSTALL}"
    if os.geteuid() != 0:
        return "slurmd starts each job as its user, so it runs as root, and these tests do not"
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Slurm:
    """The cluster. `env` is what its commands need (SLURM_CONF, the daemons' folder on PATH)."""

    def __init__(self, folder: Path):
        self.folder = folder
        for name in ("state", "spool"):
            (folder / name).mkdir(parents=True)
        folder.chmod(0o755)  # munged refuses a socket in a folder others cannot reach
        (folder / "munge.key").write_bytes(os.urandom(1024))
        (folder / "munge.key").chmod(0o400)
        host = socket.gethostname().split(".")[0]  # slurmctld and slurmd each find their name in the config by it
        (folder / "slurm.conf").write_text(CONF.format(host=host, folder=folder, cpus=os.cpu_count(),
                                                       ctld_port=free_port(), d_port=free_port()))
        self.env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf"), "PATH": path_with_sbin()}
        self.daemons: list[subprocess.Popen] = []
        self.start("munged", "--foreground", "--force", f"--socket={folder}/munge.socket",
                   f"--key-file={folder}/munge.key", f"--pid-file={folder}/munged.pid",
                   f"--seed-file={folder}/munged.seed", f"--log-file={folder}/munged.log")
        self.wait(lambda: (folder / "munge.socket").exists(), "munged to open its socket")
        self.start("slurmctld", "-D", "-i")
        self.start("slurmd", "-D")
        self.wait(lambda: self.command("sinfo", "-h", "-o", "%T", check=False) == "idle", "the node to be idle")

    def start(self, *command: str) -> None:
        log = (self.folder / f"{command[0]}.out").open("w")
        self.daemons.append(subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def command(self, *command: str, check: bool = True) -> str:
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode:
            raise AssertionError(f"{' '.join(command)} failed: {done.stderr.strip()}\n{self.logs()}")
        return done.stdout.strip()

    def wait(self, condition, what: str, timeout: float = 60) -> None:
        """Return once `condition()` holds; fail with the daemons' logs where one ends first or time runs out."""
        try:
            wait_for(condition, *self.daemons, timeout=timeout)
        except AssertionError as failed:
            raise AssertionError(f"Slurm, waiting for {what}: {failed}\n{self.logs()}") from None

    def logs(self) -> str:
        return "".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(self.folder.glob("*.log")))

    def submit(self, folder: Path, script: Path, *arguments: str, env: dict[str, str]) -> str:
        """sbatch `script` `arguments` from `folder`, the job's environment this cluster's with `env`: the job id."""
        done = subprocess.run(["sbatch", "--parsable", str(script), *arguments], cwd=folder,
                              env={**self.env, **env}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job`'s fields of the job, such as JobState, Restarts and ExitCode."""
        line = self.command("scontrol", "show", "job", "--oneliner", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def wait_for_state(self, job_id: str, state: str, timeout: float = 300) -> dict[str, str]:
        fields = {}

        def reached() -> bool:
            nonlocal fields
            fields = self.job(job_id)
            assert fields["JobState"] not in {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"} or state == \
                fields["JobState"], f"job {job_id} ended {fields['JobState']} ({fields.get('ExitCode')})"
            return fields["JobState"] == state

        self.wait(reached, f"job {job_id} to be {state}", timeout)
        return fields

    def start_requeued_now(self, job_id: str) -> None:
        """Let a requeued job start now: Slurm holds one back for two minutes (its EligibleTime), which a test need
        not wait out."""
        self.wait_for_state(job_id, "PENDING")
        self.command("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    def close(self) -> None:
        """Cancel every job, stop the daemons, and kill what a job left behind, found by this cluster's SLURM_CONF."""
        import psutil

        self.command("scancel", "--user=root", check=False)
        try:
            self.wait(lambda: not self.command("squeue", "-h", check=False), "the jobs to end", timeout=60)
        except AssertionError:
            pass  # killed below
        for process in reversed(self.daemons):  # slurmd, slurmctld, then munged, whom they ask to the end
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for process in psutil.process_iter():
            try:
                if process.environ().get("SLURM_CONF") == self.env["SLURM_CONF"]:
                    process.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
