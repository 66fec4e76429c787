"""The template's own tools: `make gpu-check` refuses a machine without CUDA; `make wheelhouse` fills a folder
that installs with no network."""
import os
import subprocess
import sys
import zipfile

import pytest


def test_gpu_check_refuses_a_machine_without_cuda_in_one_line(template, tmp_path):
    result = subprocess.run(["make", "--no-print-directory", "gpu-check", f"GPU_PYTHON={sys.executable}"],
                            cwd=template, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "GPU_CHECK_DIR": str(tmp_path / "out")})
    assert result.returncode != 0
    ours = [line for line in result.stderr.splitlines() if not line.startswith("make")]
    assert ours == [f"error: make gpu-check needs a CUDA GPU, and {sys.executable} sees none (no torch, or "
                    "torch.cuda.is_available() is False): run it on the GPU machine, with GPU_PYTHON=<its python> if "
                    "that is another one"]
    assert not (tmp_path / "out").exists()


@pytest.mark.full
def test_wheelhouse_builds_wheels_for_the_target_and_leaves_out_what_it_has(template, tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("antlr4-python3-runtime==4.9.3  # published as source only\nsimplejpeg\ntorch\n"
                            "torchmetrics  # needs torch, which needs sympy and CUDA libraries\n")
    out = tmp_path / "wheelhouse"
    subprocess.run([sys.executable, str(template / "tools/wheelhouse.py"), "--out", str(out), "--python", "3.12",
                    "--skip", "torch NumPy", str(requirements)], check=True, capture_output=True, timeout=600)
    wheels = {path.name.split("-")[0].lower(): path.name for path in out.iterdir()}
    assert {"antlr4_python3_runtime", "simplejpeg", "torchmetrics", "lightning_utilities"} <= set(wheels), wheels
    # numpy and torch are on the target already, and with torch whatever only it needs
    assert not {"numpy", "torch", "sympy", "networkx", "jinja2"} & set(wheels), wheels
    assert not any(name.startswith("nvidia") for name in wheels), wheels
    assert wheels["antlr4_python3_runtime"] == "antlr4_python3_runtime-4.9.3-py3-none-any.whl"  # built from source
    simplejpeg = wheels["simplejpeg"]
    assert "-cp312-cp312-" in simplejpeg and "manylinux" in simplejpeg
    with zipfile.ZipFile(out / simplejpeg) as wheel:
        assert any(name.startswith("simplejpeg/") for name in wheel.namelist())

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(out),
                    "--target", str(target), "antlr4-python3-runtime"], check=True, capture_output=True, timeout=300)
    imported = subprocess.run([sys.executable, "-c", "import antlr4; print(antlr4.__file__)"], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(target)}, check=True)
    assert imported.stdout.startswith(str(target))


def test_the_cuda_preflight_names_a_wheel_built_for_another_cuda_than_torch(template, monkeypatch):
    monkeypatch.syspath_prepend(str(template / "tools"))
    import cuda_preflight

    codec, dali = list(cuda_preflight.WHEELS)
    found = cuda_preflight.mismatches(12, {codec: 13, dali: 12})
    assert found == ["torch is built for CUDA 12 and torchcodec for CUDA 13: install the torchcodec wheel for CUDA 12 "
                     "(pip install torchcodec --index-url https://download.pytorch.org/whl/cu120), or a torch built "
                     "for CUDA 13"]
    assert cuda_preflight.mismatches(13, {codec: 13, dali: None}) == []  # DALI absent: its tests skip instead
    assert cuda_preflight.mismatches(None, {codec: 13, dali: 13}) == []  # a CPU torch: make gpu-check stops earlier



def test_the_slow_tier_is_due_on_every_tenth_commit_and_when_the_code_it_covers_changed(template, monkeypatch,
                                                                                         tmp_path):
    monkeypatch.syspath_prepend(str(template / "tools"))
    import slow_tier

    record = tmp_path / "slow-tier"
    monkeypatch.setattr(slow_tier, "RECORD", record)
    monkeypatch.setattr(slow_tier, "commits", lambda: 41)
    assert slow_tier.due() == (True, "runs: no green run is recorded (slow-tier is missing)")
    record.write_text(f"{slow_tier.covered_hash()}  # ...\n")
    assert slow_tier.due() == (False, "skipped: the code it covers is as at its last green run, and commit 41 is not "
                                      "a multiple of 10")
    monkeypatch.setattr(slow_tier, "commits", lambda: 50)
    assert slow_tier.due() == (True, "runs: commit 50 is a multiple of 10, when it runs whatever changed")
    monkeypatch.setattr(slow_tier, "commits", lambda: 51)
    changed = tmp_path / "test_nodes.py"
    changed.write_bytes(slow_tier.COVERED[-1].read_bytes() + b"# a change\n")
    monkeypatch.setattr(slow_tier, "COVERED", [*slow_tier.COVERED[:-1], changed])
    assert slow_tier.due() == (True, "runs: the code it covers changed since its last green run")
