# Two entry points (see README): `make pipeline` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: setup pipeline test test-quick lock

$(INSTALLED): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements.lock -e ".[minari,test,envs]"
	touch $@

setup: $(INSTALLED)

# The quick tour of the pipeline: local Ray, SQLite MLflow store (mlflow.db), local DVC cache. `orl repro` is
# `dvc repro` with every stage on one Ray, started once.
pipeline: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" orl repro

# Both tiers run in two pytest processes that share out the test files: one alone leaves the cores a third idle while
# it waits on servers, clusters and start-ups. One torch thread each: two per process would spin against each other's
# (docs/testing.md).
PYTEST := PATH="$(CURDIR)/$(BIN):$$PATH" OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile

# The full suite, as CI runs it.
test: setup
	$(PYTEST)

# The quick tier for the edit loop (docs/testing.md): every package's unit tests, without the tests marked slow.
test-quick: setup
	$(PYTEST) -m "not slow" --durations=5

# After a change to code or params: re-runs only the stages it made stale, in this working copy, then lists what to
# commit with the change (tests/test_dvc_lock.py fails while dvc.lock is stale).
lock: pipeline
	git status --short -- dvc.lock runs reports

# d3rlpy pins another gymnasium than ray[rllib], so the quality table runs it from its own virtualenv.
D3RLPY_VENV := .venv-d3rlpy

$(D3RLPY_VENV)/.installed: benchmarks/requirements-d3rlpy.lock
	$(PYTHON) -m venv $(D3RLPY_VENV)
	$(D3RLPY_VENV)/bin/pip install --quiet -r benchmarks/requirements-d3rlpy.lock
	touch $@

.PHONY: quality-table
quality-table: setup $(D3RLPY_VENV)/.installed
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python benchmarks/quality_table.py $(ARGS)

# The full dataset suite and learner matrix that benchmarks/README.md reports: a DVC project of its own in
# benchmarks/suite/ (the root's stages, its own params.yaml and outputs), so the quick tour's `dvc status` never lists it.
.PHONY: suite
suite: setup
	cd benchmarks/suite && PATH="$(CURDIR)/$(BIN):$$PATH" orl repro

# The Atari suite (benchmarks/atari.md): Pong and Breakout datasets of over 1M transitions and
# the discrete learners with the Nature DQN's CNN, in the same way; on 2 CPU cores it runs for many hours.
.PHONY: suite-atari
suite-atari: setup
	cd benchmarks/atari && PATH="$(CURDIR)/$(BIN):$$PATH" orl repro

# The MuJoCo suite (benchmarks/mujoco.md): HalfCheetah and Hopper datasets of 1M transitions from
# random play and policies PPO trains online, and BC, CQL and IQL, in the same way; hours on 2 CPU cores.
.PHONY: suite-mujoco
suite-mujoco: setup
	cd benchmarks/mujoco && PATH="$(CURDIR)/$(BIN):$$PATH" orl repro
