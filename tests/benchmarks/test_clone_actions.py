"""benchmarks/clone_actions.py: how often BC's clones act at the bounds, against the data."""

from __future__ import annotations

import itertools
import json
import re
import subprocess

import gymnasium as gym
import numpy as np
import pytest
import yaml

from benchmarks.clone_actions import summary, unit
from evaluation.references import reference_path
from pipelines.params import load_params
from tests.conftest import REPO, assert_user_error, run_benchmark


def test_shares_at_the_bounds_and_the_distance_are_read_in_half_widths():
    space = gym.spaces.Box(np.array([-2.0, 0.0]), np.array([2.0, 10.0]))
    logged = unit(np.array([[2.0, 5.0], [-1.99, 0.0], [0.0, 5.0], [1.0, 9.0]]), space)
    np.testing.assert_allclose(logged, [[1.0, 0.0], [-0.995, -1.0], [0.0, 0.0], [0.5, 0.8]])
    actions = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.5, 0.8]])  # the second row moved 0.995 and 1.0

    result = summary(actions, logged)

    assert summary(logged, logged) == {"any_joint": 0.5, "per_joint": [0.5, 0.25],
                                       "magnitude": pytest.approx((1.0 + 0.995 + 1.0 + 0.5 + 0.8) / 8), "distance": 0.0}
    assert result["any_joint"] == 0.25 and result["per_joint"] == [0.25, 0.0]
    assert result["magnitude"] == pytest.approx((1.0 + 0.5 + 0.8) / 8)
    assert result["distance"] == pytest.approx((0.995 + 1.0) / 8)


@pytest.mark.slow  # four tiny BCs trained in a subprocess
def test_it_trains_each_clone_once_then_reads_them(pendulum_dataset, tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["algos"]["bc"].update(iterations=1, updates_per_iteration=5)
    params["evaluate"].update(episodes=2, num_workers=0)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    evaluate = load_params(tmp_path / "params.yaml").evaluate
    reference = reference_path(tmp_path / "references", "Pendulum-v1")
    reference.parent.mkdir()
    reference.write_text(json.dumps({"env_id": "Pendulum-v1", "seed": evaluate.seed, "episodes": evaluate.episodes,
                                     "random": {"mean": -1200.0}, "expert": {"mean": -150.0}}))

    def run(*args) -> subprocess.CompletedProcess:
        result = run_benchmark("clone_actions", "--params", tmp_path / "params.yaml", "--dataset", pendulum_dataset,
                               "--checkpoints", tmp_path / "bc", "--set", "lr=0.0003", *args)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    def table(result: subprocess.CompletedProcess) -> dict[str, list[str]]:
        return {line.split("|")[1].strip(): line.split("|")[2:-1] for line in result.stdout.splitlines()
                if re.match(r"\| (data|BC)", line)}

    first, second = run(), run()
    assert first.stderr.count("[train bc") == 3 and "[train bc" not in second.stderr
    assert "BC with lr 0.0003, 5 updates (--set lr=0.0003)" in first.stdout
    rows = table(second)
    assert list(rows) == ["data", "BC, gaussian, seed 0", "BC, squashed_gaussian, seed 0", "BC, deterministic, seed 0"]
    assert float(rows["data"][-1]) == 0.0 and all(0.0 <= float(value) <= 1.0 for row in rows.values()
                                                   for value in row[:-1])
    pairs = re.findall(r"\n(BC, \w+, seed 0) and (BC, \w+, seed 0): mean distance [\d.]+\n", second.stdout)
    assert pairs == list(itertools.combinations(list(rows)[1:], 2))
    assert first.stdout == second.stdout  # the same networks, read back

    # Another seed of one distribution: only its clone is trained, and each is scored on the evaluation episodes.
    scored = run("--distributions", "squashed_gaussian", "--seeds", "0", "1", "--references", tmp_path / "references")
    assert scored.stderr.count("[train bc") == 1 and "seed 1" in scored.stderr
    rows = table(scored)
    assert list(rows) == ["data", "BC, squashed_gaussian, seed 0", "BC, squashed_gaussian, seed 1"]
    assert "normalized score |" in scored.stdout and rows["data"][-1].strip() == ""
    assert rows["BC, squashed_gaussian, seed 0"][:-1] == table(second)["BC, squashed_gaussian, seed 0"]
    # Pendulum's returns lie in [-3,300, 0] (200 steps of at least -16.3): in [-200, 114.3] against this reference.
    assert all(-200 <= float(rows[label][-1]) <= 114.3 for label in list(rows)[1:])
    assert "seed 0 and BC, squashed_gaussian, seed 1: mean distance" in scored.stdout  # two clones: the seeds'


def test_it_refuses_a_dataset_that_is_not_there(tmp_path):
    result = run_benchmark("clone_actions", "--params", REPO / "params.yaml", "--dataset", tmp_path / "nothing",
                           "--checkpoints", tmp_path / "bc")
    assert_user_error(result, str(tmp_path / "nothing"), prog="clone_actions.py")
