# The two commands of the README: `make demo` and `make test`. Each bootstraps .venv itself.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck unit bench notebooks clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "blitzplan needs Python 3.11 or newer (found $(PYTHON))"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# the demo's install: the library and matplotlib for its PNG; no torch, no notebooks
$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[plot]"
	touch $@

# torch first from the pinned CPU build, so the extra's range pulls nothing more
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev,exact,torch,notebooks,plot]"
	touch $@ $(VENV)/.core

demo: $(VENV)/.core
	$(BIN)/blitzplan demo

lint: $(VENV)/.dev
	$(BIN)/ruff check blitzplan tests benchmarks

typecheck: $(VENV)/.dev
	$(BIN)/mypy

unit: $(VENV)/.dev
	$(BIN)/python -m pytest

test: lint typecheck unit

# re-execute every notebook's jupytext source (full form) and rewrite its .ipynb with outputs
notebooks: $(VENV)/.dev
	$(BIN)/python -m tests.notebook_run

bench: $(VENV)/.dev
	for script in benchmarks/*.py; do $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
