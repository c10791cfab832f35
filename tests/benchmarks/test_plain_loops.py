"""benchmarks/plain_loops.py: d3rlpy's recipes as plain torch loops, for diagnosing parity with d3rlpy."""

from __future__ import annotations

import argparse
import json
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from benchmarks.plain_loops import batch_rows, train_bc
from evaluation.references import reference_path
from pipelines.params import load_params
from tests.conftest import REPO, run_benchmark
from training.algorithms.batch_columns import ACTIONS, OBS


def test_passes_draw_each_row_once_a_pass_and_replacement_draws_at_random():
    passes = batch_rows(10, 3, "passes", torch.Generator().manual_seed(0))
    first_pass = torch.cat([next(passes) for _ in range(3)])  # the tenth row is left for no partial batch
    second_pass = torch.cat([next(passes) for _ in range(3)])
    assert len(set(first_pass.tolist())) == 9 and len(set(second_pass.tolist())) == 9
    assert first_pass.tolist() != second_pass.tolist()  # a fresh permutation each pass

    drawn = torch.cat([next(batch_rows(10, 3, "replacement", torch.Generator().manual_seed(seed)))
                       for seed in range(20)])
    assert set(drawn.tolist()) == set(range(10))


def test_bc_fits_a_controller_and_acts_in_the_envs_bounds():
    generator = np.random.default_rng(0)
    obs = generator.normal(size=(2000, 3)).astype(np.float32)
    unit_actions = np.tanh(obs @ np.array([[1.0, -0.5], [0.5, 0.0], [0.0, 2.0]], dtype=np.float32))
    space = gym.spaces.Box(np.array([-2.0, 0.0], dtype=np.float32), np.array([2.0, 10.0], dtype=np.float32))
    args = argparse.Namespace(hidden=[64], lr=3e-3, batch_size=64, sampling="passes", updates=1500)

    act = train_bc({OBS: torch.as_tensor(obs), ACTIONS: torch.as_tensor(unit_actions)}, space, args, seed=0)

    with torch.no_grad():
        actions = np.stack([act(torch.as_tensor(row)[None]) for row in obs[:200]])
    expected = space.low + (unit_actions[:200] + 1.0) / 2.0 * (space.high - space.low)
    assert np.abs(actions - expected).mean() < 0.05 * (space.high - space.low).mean()
    assert space.contains(actions.max(0)) and space.contains(actions.min(0))


@pytest.mark.slow  # tiny runs of both recipes, in subprocesses
def test_each_recipe_scores_each_seed_on_the_evaluation_episodes_and_refuses_the_other_actions(
        pendulum_dataset, expert_dataset, tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["evaluate"].update(episodes=2, num_workers=0)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    evaluate = load_params(tmp_path / "params.yaml").evaluate
    (tmp_path / "references").mkdir()
    for env_id, random, expert in (("Pendulum-v1", -1200.0, -150.0), ("CartPole-v1", 20.0, 500.0)):
        reference_path(tmp_path / "references", env_id).write_text(json.dumps(
            {"env_id": env_id, "seed": evaluate.seed, "episodes": evaluate.episodes, "random": {"mean": random},
             "expert": {"mean": expert}}))

    def run(recipe, dataset, *args):
        return run_benchmark("plain_loops", "--recipe", recipe, "--params", tmp_path / "params.yaml",
                             "--datasets-dir", dataset.parent, "--dataset", dataset.name,
                             "--references", tmp_path / "references", "--updates", "50", *args)

    scored = run("bc", pendulum_dataset, "--seeds", "0", "1", "--sampling", "passes")
    assert scored.returncode == 0, scored.stderr[-3000:]
    seeds = re.findall(r"pendulum-medium bc seed (\d): normalized (-?[\d.]+) \(returns (-?\d+), (-?\d+)\)",
                       scored.stdout)  # two evaluation episodes each
    assert [seed for seed, *_ in seeds] == ["0", "1"]
    # Pendulum's returns lie in [-3,300, 0] (200 steps of at least -16.3): in [-200, 114.3] against this reference.
    assert all(-200 <= float(score) <= 114.3 and -3300 <= float(first) <= 0 for _, score, first, _ in seeds)
    assert "pendulum-medium bc, passes: " in scored.stdout and "over seeds [0, 1]" in scored.stdout

    cql = run("discrete-cql", expert_dataset, "--seeds", "0")
    assert cql.returncode == 0, cql.stderr[-3000:]
    score = float(re.search(r"cartpole-expert discrete-cql seed 0: normalized (-?[\d.]+)", cql.stdout).group(1))
    assert -4.2 <= score <= 100.0  # CartPole's returns lie in [1, 500]

    for recipe, dataset, kind in (("bc", expert_dataset, "Box"), ("discrete-cql", pendulum_dataset, "Discrete")):
        refused = run(recipe, dataset)
        assert refused.returncode != 0 and f"{recipe} needs {kind} actions" in refused.stderr
