# The two commands of the README: `make demo` and `make test`. Each bootstraps .venv itself.
# `make gpu-check` runs the executor's GPU paths and times the compute model's kernels on a machine
# with a GPU (both skip without one).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck unit bench notebooks gpu-check clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "blitzplan needs Python 3.11 or newer (found $(PYTHON))"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# the demo's install: the library and matplotlib for its PNG; no torch, no notebooks
$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[plot]"
	touch $@

# torch first from the pinned CPU build, so the extra's range pulls nothing more; NIXL (the
# nixl extra) without its dependencies, which are CUDA wheels: on the CPU it needs only numpy
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev,exact,torch,notebooks,plot]"
	$(BIN)/python -m pip install -q --no-deps nixl-cu12==1.5.1
	touch $@ $(VENV)/.core

demo: $(VENV)/.core
	$(BIN)/blitzplan demo

lint: $(VENV)/.dev
	$(BIN)/ruff check blitzplan tests benchmarks

typecheck: $(VENV)/.dev
	$(BIN)/mypy

# one worker per core (pytest-xdist); tests share no state, so any order on any worker holds
unit: $(VENV)/.dev
	$(BIN)/python -m pytest -n auto --dist worksteal

test: lint typecheck unit

# re-execute every notebook's jupytext source (full form) and rewrite its .ipynb with outputs
notebooks: $(VENV)/.dev
	$(BIN)/python -m tests.notebook_run

bench: $(VENV)/.dev
	for script in benchmarks/*.py; do $(BIN)/python $$script || exit 1; done

gpu-check: $(VENV)/.dev
	$(BIN)/python benchmarks/gpu_check.py
	$(BIN)/python benchmarks/gpu_layers.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
