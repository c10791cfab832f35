"""benchmarks/clone_actions.py: how often BC's clones act at the bounds, against the data."""

from __future__ import annotations

import re
import subprocess

import gymnasium as gym
import numpy as np
import pytest
import yaml

from benchmarks.clone_actions import summary, unit
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


@pytest.mark.slow  # two tiny BCs trained in a subprocess
def test_it_trains_each_clone_once_then_reads_them(pendulum_dataset, tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["algos"]["bc"].update(iterations=1, updates_per_iteration=5)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))

    def run() -> subprocess.CompletedProcess:
        result = run_benchmark("clone_actions", "--params", tmp_path / "params.yaml", "--dataset", pendulum_dataset,
                               "--checkpoints", tmp_path / "bc", "--set", "lr=0.0003")
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    first, second = run(), run()
    assert first.stderr.count("[train bc") == 2 and "[train bc" not in second.stderr
    assert "BC with lr 0.0003, 5 updates (--set lr=0.0003)" in first.stdout
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in second.stdout.splitlines()
            if re.match(r"\| (data|BC)", line)}
    assert list(rows) == ["data", "BC, gaussian", "BC, squashed_gaussian"]
    assert float(rows["data"][-1]) == 0.0 and all(0.0 <= float(value) <= 1.0 for row in rows.values()
                                                   for value in row[:-1])
    assert re.search(r"The clones' mean distance from each other: [\d.]+\n", second.stdout)
    assert first.stdout == second.stdout  # the same networks, read back


def test_it_refuses_a_dataset_that_is_not_there(tmp_path):
    result = run_benchmark("clone_actions", "--params", REPO / "params.yaml", "--dataset", tmp_path / "nothing",
                           "--checkpoints", tmp_path / "bc")
    assert_user_error(result, str(tmp_path / "nothing"), prog="clone_actions.py")
