# The README's two commands. Each creates .venv on first use and installs requirements.txt into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# uv installs, because it links each package's files from one cache into every venv: torch's CUDA build is
# about 5 GiB, and make test-full's second venv adds 30 MiB instead of another 5 GiB. The cache stays in build/,
# on the venvs' own file system, since a hard link cannot cross file systems.
UV := $(PY) -m uv
export UV_CACHE_DIR := $(abspath build/uv-cache)
export UV_LINK_MODE := hardlink
DEMO_DIR := build/demo
DEMO_PROJECT := $(DEMO_DIR)/fasttrain-project

# The loop on ResNet-18 and 64-pixel crops of the synthetic set: a deliberately starved run and its verdict,
# tune fixing it (allowed to decode the data set once into a pack), then six epochs of the tuned configuration
# ending with its report (cpu_quick's three epochs left top-1 between 70% and 94% over three seeds, six between
# 98% and 100%). The start reads from a simulated slow disk (each image 10 ms late, in the loader), so that it
# waits for data on any CPU, however fast it decodes.
DEMO_START := experiment=cpu_quick loader.num_workers=0 decoder=pil faults.read_delay_ms=10
DEMO_RUNS := outputs/demo
BASE_DIR := build/base
BASE_PROJECT := $(BASE_DIR)/fasttrain-project
BASE_VENV := build/base-venv

# make gpu-check: GPU_PYTHON (default python3) is the GPU machine's Python with its CUDA torch; GPU_CHECK_MINUTES
# the time at hand; GPU_CHECK_FASHION_MNIST a folder of Fashion-MNIST's IDX files, for the accuracy rows.
# make wheelhouse: WHEEL_PYTHON (such as 3.12) and WHEELHOUSE_SKIP ("torch torchvision ...") describe the target.
WHEELHOUSE ?= wheelhouse
WHEEL_PYTHON ?=
WHEELHOUSE_SKIP ?=

.PHONY: demo test test-full test-base test-slow gpu-check wheelhouse clean

# --compile-bytecode writes each module's .pyc at install: where PYTHONDONTWRITEBYTECODE is set, every interpreter
# would otherwise compile torch's sources again each time it starts.
$(VENV)/installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-cache-dir uv
	$(UV) pip install --quiet --compile-bytecode --python $(PY) -r requirements.txt
	touch $@

demo: $(VENV)/installed
	rm -rf $(DEMO_DIR)
	$(PY) -m cookiecutter --no-input . --output-dir $(DEMO_DIR)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e $(DEMO_PROJECT)
	cd $(DEMO_PROJECT) && $(abspath $(PY)) -m fasttrain_project.train $(DEMO_START) train.max_steps=40 \
		train.log_every=10 train.limit_val_batches=1 hydra.run.dir=$(DEMO_RUNS)/starved
	cd $(DEMO_PROJECT) && $(abspath $(PY)) -m fasttrain_project.tune $(DEMO_START) tune.budget_min=2 tune.allow_pack=true \
		hydra.run.dir=$(DEMO_RUNS)/tune
	cd $(DEMO_PROJECT) && if [ -f $(DEMO_RUNS)/tune/command.txt ]; then command="$$(cat $(DEMO_RUNS)/tune/command.txt)"; \
		else echo "demo: nothing beat the start, so the last run trains the start"; \
		command="python -m fasttrain_project.train $(DEMO_START)"; fi; \
		PATH=$(abspath $(VENV)/bin):$$PATH eval "$$command train.epochs=6 hydra.run.dir=$(DEMO_RUNS)/tuned"

# The fast tier: bakes, the hooks, and the baked project's fast tests.
test: $(VENV)/installed
	$(PY) -m pytest -m "not full" tests

# Everything CI runs, tier by tier, stopping at the first that fails, each tier's minutes printed: the fast tier;
# the rest of the template's tests and the baked project's full tier; make test-base; the slow tier, where due.
TIMED := bash tools/timed.sh
test-full: $(VENV)/installed
	@$(TIMED) fast $(MAKE) --no-print-directory test
	@$(TIMED) full $(PY) -m pytest -x -m "full and not slow" tests
	@$(TIMED) base $(MAKE) --no-print-directory test-base
	@if $(PY) tools/slow_tier.py --due; then $(TIMED) slow $(MAKE) --no-print-directory test-slow; fi

# The baked project's fast tier in a fresh virtual environment holding its base install and the test runner (pytest,
# pytest-xdist), no extra: a test that forgets to skip where an optional package is missing fails here, as it would
# for a user.
test-base: $(VENV)/installed
	rm -rf $(BASE_DIR) $(BASE_VENV)
	$(PY) -m cookiecutter --no-input . --output-dir $(BASE_DIR)
	$(PYTHON) -m venv $(BASE_VENV)
	$(UV) pip install --quiet --compile-bytecode --python $(BASE_VENV)/bin/python -e $(BASE_PROJECT) pytest pytest-xdist pytest-timeout
	$(MAKE) --no-print-directory -C $(BASE_PROJECT) tier MARKS="not full and not gpu" \
		PYTHON=$(abspath $(BASE_VENV))/bin/python ARGS="-q --durations=30"

# Jobs whose subject is scale itself (eight processes, two nodes of two), which the full tier runs smaller; on
# success, .ci/slow-tier records the code they covered, for CI to tell when they are due again.
test-slow: $(VENV)/installed
	$(PY) -m pytest -m slow tests
	$(PY) tools/slow_tier.py --record

gpu-check:
	@WHEELHOUSE=$(WHEELHOUSE) bash tools/gpu_check.sh

wheelhouse: $(VENV)/installed
	$(PY) tools/wheelhouse.py --out $(WHEELHOUSE) --python "$(WHEEL_PYTHON)" --skip "$(WHEELHOUSE_SKIP)" requirements.txt

clean:
	rm -rf $(VENV) build
