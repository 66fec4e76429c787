"""`make wheelhouse`: every wheel the project needs in one folder, so that a machine with no network installs it.

    python tools/wheelhouse.py --out wheelhouse requirements.txt
    python tools/wheelhouse.py --out wheelhouse --python 3.12 --skip "torch torchvision" requirements.txt

pip resolves the requirements for this interpreter (`pip install --dry-run --report`), leaving out the --skip
names (what the target machine has already) and whatever only they need: the packages kept are those reachable
from the requested ones without passing through a skipped one. Each resolved version is then
downloaded for the target's Python and platform; a package published only as source is built into a wheel
here. Install from the folder with `pip install --no-index --find-links wheelhouse ...`.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_lines(path: Path, skip: set[str]) -> list[str]:
    """The requirement lines of `path`, less comments and the skipped names."""
    lines = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        name = re.match(r"[A-Za-z0-9._-]+", line)
        if name and canonical(name[0]) not in skip:
            lines.append(line)
    return lines


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def resolve(lines: list[str]) -> list[dict]:
    """pip's report of everything it would install for `lines` on this interpreter: one item per package."""
    with tempfile.TemporaryDirectory() as folder:
        requirements, report = Path(folder, "requirements.txt"), Path(folder, "report.json")
        requirements.write_text("\n".join(lines) + "\n")
        pip("install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report), "-r", str(requirements))
        return json.loads(report.read_text())["install"]


def needed(items: list[dict], skip: set[str]) -> list[tuple[str, str]]:
    """(name, version) of the packages reachable from the requested ones without passing through a skipped one:
    the target has the skipped packages, and with them whatever they need (torch's CUDA libraries, say)."""
    by_name = {canonical(item["metadata"]["name"]): item for item in items}
    extras = {name: set(item.get("requested_extras") or ()) for name, item in by_name.items()}
    todo = [name for name, item in by_name.items() if item.get("requested") and name not in skip]
    kept = set()
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept.add(name)
        for line in by_name[name]["metadata"].get("requires_dist") or ():
            requirement = Requirement(line)
            wanted = canonical(requirement.name)
            environments = [{"extra": extra} for extra in extras[name] or {""}]
            if wanted in by_name and wanted not in skip and (
                    requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments)):
                extras[wanted] |= set(requirement.extras)
                todo.append(wanted)
    return [(by_name[name]["metadata"]["name"], by_name[name]["metadata"]["version"]) for name in sorted(kept)]


def download(packages: list[tuple[str, str]], out: Path, python: str | None) -> None:
    target = ["--python-version", python, "--implementation", "cp",
              *(option for platform in PLATFORMS for option in ("--platform", platform))] if python else []
    for name, version in packages:
        pip("download", "--quiet", "--no-deps", "--dest", str(out), *target, f"{name}=={version}")
    for source in [*out.glob("*.tar.gz"), *out.glob("*.zip")]:  # published as source only: build the wheel here
        pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(source))
        source.unlink()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requirements", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the folder to fill")
    parser.add_argument("--python", default="", help="the target's Python, such as 3.12 (default: this one's)")
    parser.add_argument("--skip", default="", help="names the target has already, separated by spaces")
    args = parser.parse_args(argv)
    skip = {canonical(name) for name in args.skip.split()}
    packages = needed(resolve(requirement_lines(args.requirements, skip)), skip)
    args.out.mkdir(parents=True, exist_ok=True)
    download(packages, args.out, args.python or None)
    wheels = sorted(args.out.glob("*.whl"))
    size = sum(wheel.stat().st_size for wheel in wheels) / 2**20
    print(f"wheelhouse: {len(wheels)} wheels, {size:.0f} MiB in {args.out}; install with "
          f"pip install --no-index --find-links {args.out} ...")


if __name__ == "__main__":
    main()
