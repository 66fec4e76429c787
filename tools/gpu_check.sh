#!/usr/bin/env bash
# `make gpu-check`: prove a CUDA machine with a freshly baked project, within GPU_CHECK_MINUTES when given. In
# order: its `gpu` tests, its GPU benchmark (python -m <package>.gpu_check: nvJPEG against Pillow, pipelines beside
# the ceiling, each model eager / compiled / CUDA graphs / fused), then the accuracy rows on Fashion-MNIST where
# GPU_CHECK_FASHION_MNIST names its IDX folder. Each stage that would not end in the time left is skipped with a
# line. Leaves report.md, gpu_check.csv (rewritten as each run ends) and the tests' results in $GPU_CHECK_DIR/report.
# Uses the machine's own torch (GPU_PYTHON's); installs only what that Python lacks, from $WHEELHOUSE with no
# network when that folder exists (make wheelhouse).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${GPU_PYTHON:-python3}
WHEELHOUSE=${WHEELHOUSE:-wheelhouse}
OUT=${GPU_CHECK_DIR:-build/gpu-check}
PROJECT=fasttrain-project
PACKAGE=fasttrain_project
started=$(date +%s)
MINUTES=${GPU_CHECK_MINUTES:-}
# How long the gpu tests take: 104 s on one H200, before CUDA graphs' test (docs/benchmarks-log.md).
TESTS_S=110

seconds_left() { if [ -n "$MINUTES" ]; then echo $(( MINUTES * 60 - ($(date +%s) - started) )); else echo 999999; fi; }

fail() { echo "error: $*" >&2; exit 1; }

"$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || fail \
  "make gpu-check needs a CUDA GPU, and $PYTHON sees none (no torch, or torch.cuda.is_available() is False): run it on the GPU machine, with GPU_PYTHON=<its python> if that is another one"

"$PYTHON" -c 'import torchvision' 2>/dev/null || fail \
  "$PYTHON has torch but no torchvision: install the torchvision built for its torch first (pip would otherwise replace torch)"

rm -rf "$OUT"
mkdir -p "$OUT/report"
# A venv that sees GPU_PYTHON's packages (its CUDA build of torch above all) and holds only what they lack.
"$PYTHON" -m venv --without-pip "$OUT/venv"
VENV_PY=$(cd "$OUT/venv/bin" && pwd)/python
"$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' \
  > "$("$VENV_PY" -c 'import site; print(site.getsitepackages()[0])')/gpu-python.pth"
install=("$VENV_PY" -m pip install --quiet)
if [ -d "$WHEELHOUSE" ]; then
  install+=(--no-index --find-links "$WHEELHOUSE")
  echo "gpu-check: installing from $WHEELHOUSE, with no network"
fi
"${install[@]}" 'cookiecutter>=2.7' 'setuptools>=64' \
  || fail "could not install cookiecutter and setuptools: with no network, fill $WHEELHOUSE first (README: make wheelhouse)"
"$VENV_PY" -m cookiecutter --no-input . --output-dir "$OUT"
# The test extras (moto's server alone is 35 MB of wheels) are wanted, not needed: without them, the base install
# and whatever else the wheelhouse holds, and the tests of what is missing skip, saying so.
if ! "${install[@]}" --no-build-isolation -e "$OUT/$PROJECT[dev]"; then
  echo "gpu-check: the [dev] extras could not all be installed; installing the base project and the wheelhouse's" \
    "wheels, and the tests of what is missing will skip"
  "${install[@]}" --no-build-isolation -e "$OUT/$PROJECT" \
    || fail "could not install the baked project: with no network, fill $WHEELHOUSE first (README: make wheelhouse)"
  # Never the wheelhouse's torch, torchvision or CUDA libraries: they would shadow the machine's own CUDA build.
  wheels=()
  if [ -d "$WHEELHOUSE" ]; then
    for wheel in "$WHEELHOUSE"/*.whl; do
      case "$(basename "$wheel")" in torch-*|torchvision-*|nvidia_*|triton-*|'*.whl') ;; *) wheels+=("$wheel") ;; esac
    done
  fi
  if [ ${#wheels[@]} -gt 0 ]; then
    "${install[@]}" --no-deps "${wheels[@]}" \
      || fail "could not install the wheels of $WHEELHOUSE: make wheelhouse for this machine's Python (README)"
  fi
fi
# DALI (decoder=dali) is the largest wheel and may not be in the wheelhouse: without it, its tests and rows skip.
# Its wheels are built per CUDA major version: the one for this torch's, unless one is installed already.
dali="nvidia-dali-cuda$("$VENV_PY" -c 'import torch; print(torch.version.cuda.split(".")[0])')0"
"$VENV_PY" -m pip list 2>/dev/null | grep -q '^nvidia-dali-cuda' || "${install[@]}" "$dali" 2>/dev/null \
  || echo "gpu-check: DALI could not be installed (pip install $dali); its tests and rows will skip"
"$VENV_PY" tools/cuda_preflight.py

cd "$OUT/$PROJECT"
tests=0
tests_xml=null
if [ "$(seconds_left)" -ge "$TESTS_S" ]; then
  PYTHONUNBUFFERED=1 "$VENV_PY" -m pytest -m gpu -p no:cacheprovider -q -rfEs --junitxml ../report/gpu-tests.xml \
    | tee ../report/gpu-tests.txt || tests=$?
  tests_xml="$(cd ../report && pwd)/gpu-tests.xml"
else
  echo "gpu-check: gpu tests skipped: $(seconds_left) s of GPU_CHECK_MINUTES=$MINUTES left, and they take about $TESTS_S s"
fi
minutes=null
[ -z "$MINUTES" ] || minutes=$(awk "BEGIN { print $(seconds_left) / 60 }")
# GPU_CHECK_ARGS: more overrides for the benchmark, such as "~gpu_check.steps.compile" to leave runs out.
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 "$VENV_PY" -m "$PACKAGE.gpu_check" hydra.run.dir=../report gpu_check.minutes="$minutes" \
  gpu_check.tests_xml="$tests_xml" ${GPU_CHECK_ARGS:-} | tee ../report/gpu-check.txt
if [ -n "${GPU_CHECK_FASHION_MNIST:-}" ] && [ "$(seconds_left)" -lt 120 ]; then
  echo "gpu-check: accuracy rows skipped: $(seconds_left) s of GPU_CHECK_MINUTES=$MINUTES left, and one row of 3 seeds takes minutes"
elif [ -n "${GPU_CHECK_FASHION_MNIST:-}" ]; then
  # The accuracy table is rewritten whole as each row ends: stopped at the time left, it keeps the rows it finished.
  "$VENV_PY" scripts/fashion_mnist.py ../fashion-mnist --idx "$GPU_CHECK_FASHION_MNIST" \
    && timeout "$(seconds_left)" "$VENV_PY" scripts/accuracy.py ../fashion-mnist --work ../accuracy --device cuda \
      --jobs 5 --workers 2 --out ../report/accuracy.md \
    || echo "gpu-check: the accuracy rows ended early (the time left, or the failure above); report/accuracy.md keeps those finished"
fi
echo "gpu-check: $(( $(date +%s) - started )) s in all; report in $OUT/report/report.md"
[ "$tests" = 0 ] || fail "gpu tests failed (pytest exit $tests): see $OUT/report/gpu-tests.txt"
