# The README's two commands. Each creates .venv on first use and installs requirements.txt into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_DIR := build/demo
DEMO_PROJECT := $(DEMO_DIR)/fasttrain-project

# ResNet-18 on 112-pixel crops learns the synthetic classes in a few CPU minutes.
DEMO_OVERRIDES := hydra.run.dir=outputs/demo model.name=resnet18 data.crop_size=112 data.val_resize=128 \
	train.batch_size=32 train.epochs=4

# make gpu-check: GPU_PYTHON (default python3) is the GPU machine's Python with its CUDA torch.
# make wheelhouse: WHEEL_PYTHON (such as 3.12) and WHEELHOUSE_SKIP ("torch torchvision ...") describe the target.
WHEELHOUSE ?= wheelhouse
WHEEL_PYTHON ?=
WHEELHOUSE_SKIP ?=

.PHONY: demo test gpu-check wheelhouse clean

$(VENV)/installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

demo: $(VENV)/installed
	rm -rf $(DEMO_DIR)
	$(PY) -m cookiecutter --no-input . --output-dir $(DEMO_DIR)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e $(DEMO_PROJECT)
	cd $(DEMO_PROJECT) && $(abspath $(PY)) -m fasttrain_project.train $(DEMO_OVERRIDES)

test: $(VENV)/installed
	$(PY) -m pytest tests

gpu-check:
	@WHEELHOUSE=$(WHEELHOUSE) bash tools/gpu_check.sh

wheelhouse: $(VENV)/installed
	$(PY) tools/wheelhouse.py --out $(WHEELHOUSE) --python "$(WHEEL_PYTHON)" --skip "$(WHEELHOUSE_SKIP)" requirements.txt

clean:
	rm -rf $(VENV) build
