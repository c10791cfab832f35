"""benchmarks/iql_advantages.py: where IQL's advantage weights go, by the episodes' returns."""

from __future__ import annotations

import math
import re
import subprocess

import numpy as np
import pytest
import yaml

from benchmarks.iql_advantages import summary
from tests.conftest import REPO, assert_user_error, run_benchmark


def test_the_weight_goes_to_the_episodes_whose_actions_have_the_advantage():
    eps_id = np.repeat(np.arange(10), 5)  # ten episodes of five steps, returning 0, 5, ..., 45
    rewards = eps_id.astype(np.float32)
    advantage = np.where(eps_id == 9, 2.0, 0.0)  # the best episode's actions are 2 better than V

    result = summary(advantage, eps_id, rewards, beta=1.0)

    top = result["bins"][-1]  # the top 10 %: the best episode
    assert top["returns"] == [pytest.approx(np.quantile(np.arange(10) * 5.0, 0.9)), 45.0]
    assert top["row_share"] == pytest.approx(0.1)
    assert top["weight_share"] == pytest.approx(math.e**2 / (math.e**2 + 9))
    assert top["mean_advantage"] == pytest.approx(2.0)
    assert sum(row["row_share"] for row in result["bins"]) == pytest.approx(1.0)
    assert sum(row["weight_share"] for row in result["bins"]) == pytest.approx(1.0)
    assert result["capped_share"] == 0.0
    weights = np.where(eps_id == 9, math.e**2, 1.0)
    assert result["effective_share"] == pytest.approx(weights.sum() ** 2 / (50 * np.square(weights).sum()))
    assert result["spearman_episode_advantage_return"] > 0


@pytest.mark.slow  # a tiny IQL trained in a subprocess
def test_it_trains_iql_once_then_reads_its_checkpoint(pendulum_dataset, tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["algos"]["iql"].update(iterations=1, updates_per_iteration=5)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))

    def run() -> subprocess.CompletedProcess:
        result = run_benchmark("iql_advantages", "--params", tmp_path / "params.yaml", "--dataset", pendulum_dataset,
                               "--checkpoint", tmp_path / "iql")
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    first, second = run(), run()
    assert "[train iql" in first.stderr and "[train iql" not in second.stderr
    rows = [line.split("|") for line in second.stdout.splitlines() if re.match(r"\| -?[\d.]+ to ", line)]
    assert len(rows) == 5
    assert sum(float(row[2]) for row in rows) == pytest.approx(1.0, abs=0.01)
    assert sum(float(row[3]) for row in rows) == pytest.approx(1.0, abs=0.01)
    assert first.stdout == second.stdout  # the same networks, read back


def test_it_refuses_a_dataset_that_is_not_there(tmp_path):
    result = run_benchmark("iql_advantages", "--params", REPO / "params.yaml", "--dataset", tmp_path / "nothing",
                           "--checkpoint", tmp_path / "iql")
    assert_user_error(result, str(tmp_path / "nothing"), prog="iql_advantages.py")
