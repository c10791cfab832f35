"""benchmarks/critic_probe.py: what a kept CQL's critics say of the logged actions, its own and random ones."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import dataset_format as dataset
from benchmarks.clone_actions import greedy_actions, unit
from benchmarks.critic_probe import probe
from benchmarks.quality_table import train_ours
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from tests.benchmarks.test_cql_curves import tiny_cql
from tests.conftest import assert_user_error, run_benchmark


@pytest.fixture(scope="module")
def kept_cql(pendulum_dataset, tmp_path_factory) -> Path:
    """A tiny CQL trained on Pendulum, kept as `quality_table.py --keep-checkpoints` keeps it."""
    checkpoint = tmp_path_factory.mktemp("kept") / "pendulum-medium-cql-seed0"
    train_ours("cql", tiny_cql(), pendulum_dataset, 0, checkpoint)
    return checkpoint


@pytest.mark.slow  # a tiny CQL trained on Ray
def test_the_policys_own_actions_as_the_logged_ones_are_valued_as_its_own_at_no_distance(kept_cql, pendulum_dataset):
    space = dataset.read_card(pendulum_dataset).spaces[1]
    module = load_rl_module(kept_cql)
    obs = dataset.column_to_numpy(dataset.read_table(pendulum_dataset, (Col.OBS,))[Col.OBS]).astype(np.float32)
    own = unit(greedy_actions(ModulePolicy(module, space, greedy=True), obs), space).astype(np.float32)

    row = probe(module, space, obs, own, np.random.default_rng(0))

    assert row["distance"] == 0 and row["logged"] == pytest.approx(row["policy"])
    assert row["uniform"] != pytest.approx(row["policy"]) and all(math.isfinite(value) for value in row.values())


@pytest.mark.slow  # a tiny CQL trained on Ray
def test_it_prints_each_checkpoints_values_on_logged_and_first_states(kept_cql, pendulum_dataset):
    result = run_benchmark("critic_probe", "--dataset", pendulum_dataset, "--checkpoints", kept_cql, "--rows", "100")

    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines()
            if line.startswith(f"| {kept_cql.parent.name}/{kept_cql.name} |")]
    assert [row[1].strip() for row in rows] == ["logged states", "first states"]
    for row in rows:
        *values, distance = map(float, row[2:])
        assert all(math.isfinite(value) for value in values) and 0 <= distance <= 2  # half-widths apart, at most 2


def test_it_refuses_discrete_actions(expert_dataset, tmp_path):
    result = run_benchmark("critic_probe", "--dataset", expert_dataset, "--checkpoints", tmp_path / "none")
    assert_user_error(result, str(expert_dataset), "continuous actions only", prog="critic_probe.py")
