"""Whether CI runs the slow tier (`make test-slow`: jobs whose subject is scale itself), and the record of its last
green run.

    python tools/slow_tier.py --due      # one line saying whether it is due and why; exit 0 if due, 1 if not
    python tools/slow_tier.py --record   # after a green slow run: .ci/slow-tier holds what it covered

It is due where the code it covers differs from what its last green run covered, and on every tenth commit
regardless. `make test-slow` records on success; commit .ci/slow-tier with the change it tested.
"""
import argparse
import hashlib
import subprocess
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parents[1]
RECORD = TEMPLATE / ".ci/slow-tier"
EVERY = 10  # commits: the slow tier runs on each tenth, whatever changed
BAKED = TEMPLATE / "{{cookiecutter.project}}"
PACKAGE = BAKED / "src/{{cookiecutter.package}}"
# The code whose behaviour changes with the number of processes and nodes, which the slow tier tests at full scale
# and the full tier at a smaller one: starting and joining the processes, splitting and checking each epoch's
# images across them, summing their gradients, saving and resuming on another count, and ending all of them
# together.
COVERED = [
    PACKAGE / "core/distributed.py",
    PACKAGE / "core/failures.py",
    PACKAGE / "core/forensics.py",
    PACKAGE / "data/coverage.py",
    PACKAGE / "data/order.py",
    PACKAGE / "data/sampling.py",
    PACKAGE / "diagnosis/ranks.py",
    PACKAGE / "loop/accumulate.py",
    PACKAGE / "loop/checkpoint.py",
    PACKAGE / "loop/ordered.py",
    PACKAGE / "loop/preempt.py",
    BAKED / "scripts/launch.sh",
    BAKED / "tests/test_nodes.py",
    BAKED / "tests/test_same_run.py",
]


def covered_hash() -> str:
    digest = hashlib.sha256()
    for path in COVERED:  # in the list's order, each file's bytes and its end
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def commits() -> int | None:
    done = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=TEMPLATE, capture_output=True, text=True)
    return int(done.stdout) if done.returncode == 0 else None


def due() -> tuple[bool, str]:
    """Whether the slow tier runs, and the one line that says why."""
    count = commits()
    if count is not None and count % EVERY == 0:
        return True, f"runs: commit {count} is a multiple of {EVERY}, when it runs whatever changed"
    if not RECORD.exists():
        return True, f"runs: no green run is recorded ({RECORD.name} is missing)"
    recorded = RECORD.read_text().split()[0]
    if recorded != covered_hash():
        return True, "runs: the code it covers changed since its last green run"
    return False, (f"skipped: the code it covers is as at its last green run, and commit {count} is not a multiple "
                   f"of {EVERY}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--due", action="store_true", help="say whether the slow tier is due; exit 0 if it is")
    action.add_argument("--record", action="store_true", help="record a green slow run of the code as it is")
    args = parser.parse_args()
    if args.record:
        partial = RECORD.with_name(RECORD.name + ".partial")
        partial.write_text(f"{covered_hash()}  # the code tools/slow_tier.py covers, at the last green make test-slow\n")
        partial.replace(RECORD)
        print(f"slow tier: green; recorded in {RECORD} (commit it with the change)")
        return 0
    running, why = due()
    print(f"slow tier {why}")
    return 0 if running else 1


if __name__ == "__main__":
    sys.exit(main())
