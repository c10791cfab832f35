"""benchmarks/critic_probe.py: what a kept CQL's critics say of the logged actions, its own and random ones."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.clone_actions import continuous_card, greedy_actions, logged_rows, unit
from benchmarks.cql_one_update import to_d3rlpy
from benchmarks.critic_probe import probe
from benchmarks.quality_table import D3RLPY_PYTHON, train_d3rlpy, train_ours
from common.trained_policy import ModulePolicy, load_rl_module
from tests.benchmarks.test_cql_curves import tiny_cql
from tests.conftest import assert_user_error, run_benchmark


@pytest.fixture(scope="module")
def kept_cql(pendulum_dataset, tmp_path_factory) -> Path:
    """A tiny CQL trained on Pendulum, kept as `quality_table.py --keep-checkpoints` keeps it."""
    checkpoint = tmp_path_factory.mktemp("kept") / "pendulum-medium-cql-seed0"
    train_ours("cql", tiny_cql(), pendulum_dataset, 0, checkpoint)
    return checkpoint


def probed_rows(result, path: Path) -> list[list[str]]:
    """The probe's rows of the policy at `path`, each a list of its cells after the name."""
    return [[cell.strip() for cell in line.split("|")[2:-1]] for line in result.stdout.splitlines()
            if line.startswith(f"| {path.parent.name}/{path.name} |")]


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
    rows = probed_rows(result, kept_cql)
    assert [row[0] for row in rows[:2]] == ["logged states", "first states"] and len(rows) == 3
    for row in rows[:2]:
        *values, distance = map(float, row[1:])
        assert all(math.isfinite(value) for value in values) and 0 <= distance <= 2  # half-widths apart, at most 2
    steps, *values = map(float, rows[2])
    assert steps == 200  # Pendulum's episodes run to its time limit
    # Values, then returns got, at every step, the first and the last ten: a reward in [-16.3, 0] a step.
    returns = values[1::2]
    assert all(math.isfinite(value) for value in values) and all(-16.3 / (1 - 0.99) <= got <= 0 for got in returns)


@pytest.mark.slow  # d3rlpy's CQL trained briefly in its own virtualenv
@pytest.mark.skipif(not D3RLPY_PYTHON.exists(), reason="no d3rlpy virtualenv (make .venv-d3rlpy/.installed)")
def test_it_probes_d3rlpys_trained_cql_in_a_copy_of_our_module(kept_cql, pendulum_dataset, tmp_path):
    weights = tmp_path / "pendulum-medium-d3rlpy-cql-seed0.pt"
    train_d3rlpy(str(D3RLPY_PYTHON), "d3rlpy-cql", tiny_cql(), pendulum_dataset, 0, [1], {}, weights)

    result = run_benchmark("critic_probe", "--dataset", pendulum_dataset, "--checkpoints", kept_cql,
                           "--d3rlpy-weights", weights, "--rows", "100", "--episodes", "1")

    assert result.returncode == 0, result.stderr[-3000:]
    ours, theirs = probed_rows(result, kept_cql), probed_rows(result, weights)
    assert len(theirs) == 3 and all(math.isfinite(float(cell)) for row in theirs for cell in row[1:])
    assert theirs[0][1:] != ours[0][1:]  # d3rlpy's critics, not the copied module's own


@pytest.mark.slow  # a tiny CQL trained on Ray
def test_weights_of_other_sizes_are_refused_by_name(kept_cql, pendulum_dataset, tmp_path):
    weights = to_d3rlpy(dict(load_rl_module(kept_cql).named_parameters()))
    weights["q_funcs.0._fc.weight"] = torch.zeros(1, 5)
    torch.save({"weights": weights}, tmp_path / "other.pt")

    result = run_benchmark("critic_probe", "--dataset", pendulum_dataset, "--checkpoints", kept_cql,
                           "--d3rlpy-weights", tmp_path / "other.pt", "--episodes", "0")

    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"{tmp_path / 'other.pt'}: qf.net.mlp")


def test_it_refuses_discrete_actions(expert_dataset, tmp_path):
    result = run_benchmark("critic_probe", "--dataset", expert_dataset, "--checkpoints", tmp_path / "none")
    assert_user_error(result, str(expert_dataset), "continuous actions only", prog="critic_probe.py")
