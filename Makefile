# Two entry points (see README): `make pipeline` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: setup pipeline test

$(INSTALLED): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements.lock -e ".[minari,test]"
	touch $@

setup: $(INSTALLED)

# The quick tour of the pipeline: local Ray, SQLite MLflow store (mlflow.db), local DVC cache.
pipeline: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" dvc repro

test: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest

# d3rlpy pins another gymnasium than ray[rllib], so the quality table runs it from its own virtualenv.
D3RLPY_VENV := .venv-d3rlpy

$(D3RLPY_VENV)/.installed: benchmarks/requirements-d3rlpy.lock
	$(PYTHON) -m venv $(D3RLPY_VENV)
	$(D3RLPY_VENV)/bin/pip install --quiet -r benchmarks/requirements-d3rlpy.lock
	touch $@

.PHONY: quality-table
quality-table: setup $(D3RLPY_VENV)/.installed
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python benchmarks/quality_table.py $(ARGS)

# The full dataset suite and learner matrix that benchmarks/README.md reports (outputs under benchmarks/suite/).
.PHONY: suite
suite: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" dvc repro benchmarks/suite/dvc.yaml
