"""make demo's story, as docs/tune.md tells it: a start that waits for data, tune finding a configuration at least
1.3 times faster, and a tuned run that learns the synthetic classes and ends with its report."""
import json
import os
import re
import subprocess

import pytest
from conftest import venv_seeing_ours

MIN_GAIN = 1.3
# Six epochs of seed 0 end where tune's pick puts them: cpu_quick from the tensor pack tune builds reached 89.0% top-1
# (seeds 1 and 2: 100.0%), with decoder=pil and 2 workers 100.0% (the README's seeds: 100, 98, 99). The bar is a
# run that learns the ten classes (chance: 10%), whichever configuration tune keeps.
MIN_TOP1 = 85.0


@pytest.mark.full
def test_make_demo_starts_data_bound_then_tune_speeds_it_up_and_the_tuned_run_learns(template, tmp_path):
    # make demo installs the baked project into its venv: here a throwaway one that sees this one's packages, its
    # install marked done so that make does not build it.
    venv = tmp_path / "venv"
    venv_seeing_ours(venv)
    (venv / "installed").touch()
    demo = tmp_path / "demo"
    result = subprocess.run(["make", "--no-print-directory", "demo", f"VENV={venv}", f"DEMO_DIR={demo}"],
                            cwd=template, capture_output=True, text=True, timeout=1800,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    runs = demo / "fasttrain-project/outputs/demo"

    starved = json.loads((runs / "starved/summary.json").read_text())
    assert starved["bound"] == "data" and starved["data_frac"] >= 0.3, starved["verdict"]

    table = (runs / "tune/tune.md").read_text()
    before, after = re.search(r"before: ([\d.]+) images/s.*after: ([\d.]+) images/s", table).groups()
    assert float(after) / float(before) >= MIN_GAIN, table
    assert (runs / "tune/command.txt").is_file(), "tune wrote no command: the tuned run trained the start"

    tuned = json.loads((runs / "tuned/summary.json").read_text())
    assert tuned["val_top1"] >= MIN_TOP1 and tuned["images_per_s"] > starved["images_per_s"], tuned
    assert output.count("==== where the time went ====") >= 2 and tuned["verdict"] in output
