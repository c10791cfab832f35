"""benchmarks/critic_probe.py: what a kept CQL's critics say of the logged actions, its own and random ones."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.clone_actions import continuous_card, greedy_actions, logged_rows, unit
from benchmarks.critic_probe import probe
from benchmarks.quality_table import train_ours
from common.trained_policy import ModulePolicy, load_rl_module
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
    _, space = continuous_card(pendulum_dataset)
    obs, _, _ = logged_rows(pendulum_dataset, space)
    policy = ModulePolicy(load_rl_module(kept_cql), space, greedy=True)
    own = unit(greedy_actions(policy, obs), space)

    row = probe(policy, obs, own, np.random.default_rng(0))

    assert row["distance"] == 0 and row["logged"] == pytest.approx(row["policy"])
    assert row["uniform"] != pytest.approx(row["policy"]) and all(math.isfinite(value) for value in row.values())


@pytest.mark.slow  # a tiny CQL trained on Ray
def test_it_prints_each_checkpoints_values_on_logged_and_first_states_and_along_its_episodes(kept_cql,
                                                                                              pendulum_dataset):
    result = run_benchmark("critic_probe", "--dataset", pendulum_dataset, "--checkpoints", kept_cql, "--rows", "100",
                           "--episodes", "2")

    assert result.returncode == 0, result.stderr[-3000:]
    rows = [[cell.strip() for cell in line.split("|")[2:-1]] for line in result.stdout.splitlines()
            if line.startswith(f"| {kept_cql.parent.name}/{kept_cql.name} |")]
    assert [row[0] for row in rows[:2]] == ["logged states", "first states"] and len(rows) == 3
    for row in rows[:2]:
        *values, distance = map(float, row[1:])
        assert all(math.isfinite(value) for value in values) and 0 <= distance <= 2  # half-widths apart, at most 2
    steps, *values = map(float, rows[2])
    assert steps == 200  # Pendulum's episodes run to its time limit
    # Values, then returns got, at every step, the first and the last ten: a reward in [-16.3, 0] a step.
    returns = values[1::2]
    assert all(math.isfinite(value) for value in values) and all(-16.3 / (1 - 0.99) <= got <= 0 for got in returns)


def test_it_refuses_discrete_actions(expert_dataset, tmp_path):
    result = run_benchmark("critic_probe", "--dataset", expert_dataset, "--checkpoints", tmp_path / "none")
    assert_user_error(result, str(expert_dataset), "continuous actions only", prog="critic_probe.py")
