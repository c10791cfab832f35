"""benchmarks/cql_curves.py: our CQL's learning curves beside d3rlpy's, each read under its own learner's names."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import pytest

from benchmarks.cql_curves import D3RLPY, OURS, PANELS, d3rlpy_gap
from benchmarks.quality_table import D3RLPY_PYTHON, train_d3rlpy, train_ours
from pipelines.params import load_params
from tests.conftest import REPO, assert_user_error


def cql_curves(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.cql_curves", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_d3rlpys_logged_penalty_gives_back_the_mean_gap_of_its_critics():
    # Two critics with gaps 7 and 9 under a weight of 0.2: d3rlpy sums alpha * 5 * (gap - 10) over them.
    row = {"alpha": 0.2, "conservative_loss": 0.2 * 5 * (7 - 10) + 0.2 * 5 * (9 - 10)}
    cell = {"hyper_parameters": {"min_q_weight": 5.0}, "overrides": {}}
    assert d3rlpy_gap(row, cell) == pytest.approx(8.0)
    # A threshold set with --d3rlpy-set is d3rlpy's own.
    row = {"alpha": 0.2, "conservative_loss": 0.2 * 5 * (7 - 5) + 0.2 * 5 * (9 - 5)}
    assert d3rlpy_gap(row, {**cell, "overrides": {"alpha_threshold": 5.0}}) == pytest.approx(8.0)


def test_it_names_a_directory_without_a_run_and_a_learner_left_out(tmp_path):
    assert_user_error(cql_curves("--results", tmp_path, "--dataset", "pendulum-medium", "--out", tmp_path / "c.png"),
                      str(tmp_path / "quality.json"), "not found", prog="cql_curves.py")
    (tmp_path / "quality.json").write_text(json.dumps({"pendulum-medium": {}}))
    assert_user_error(cql_curves("--results", tmp_path, "--dataset", "pendulum-medium", "--out", tmp_path / "c.png"),
                      f"no learner metrics of {OURS}, {D3RLPY} on pendulum-medium", prog="cql_curves.py")
    assert not (tmp_path / "c.png").exists()


def tiny_cql():
    cql = load_params(REPO / "params.yaml").algos.get("cql")
    return dataclasses.replace(cql, iterations=3, updates_per_iteration=2, hidden_layers=[16], batch_size=32,
                               lagrangian_threshold=10.0)


@pytest.mark.slow  # our CQL built and trained on Ray
def test_our_cql_logs_every_curve_it_is_read_for(pendulum_dataset, tmp_path):
    _, path = train_ours("cql", tiny_cql(), pendulum_dataset, 0, tmp_path / "checkpoint")
    cell = {"hyper_parameters": tiny_cql().hyper_parameters(), "overrides": {}}
    for row in path:
        values = {title: value[OURS](row, cell) for title, value in PANELS.items()}
        assert all(math.isfinite(v) for v in values.values()), values
        assert 0 < values["conservative weight"] <= 1 and values["entropy temperature"] > 0


@pytest.mark.slow  # both CQLs trained, d3rlpy's in its own virtualenv
@pytest.mark.skipif(not D3RLPY_PYTHON.exists(), reason="no d3rlpy virtualenv (make .venv-d3rlpy/.installed)")
def test_it_plots_both_learners_curves_from_their_runs(pendulum_dataset, tmp_path):
    cql = tiny_cql()
    _, ours = train_ours("cql", cql, pendulum_dataset, 0, tmp_path / "checkpoint")
    _, theirs = train_d3rlpy(str(D3RLPY_PYTHON), D3RLPY, cql, pendulum_dataset, 0, [1], {})
    # The records quality_table.py keeps of each cell, which the script reads.
    cell = {"hyper_parameters": cql.hyper_parameters(), "overrides": {}}
    entry = {key: {OURS: cell[key], D3RLPY: cell[key]} for key in cell}
    entry["learner_metrics"] = {OURS: {"0": ours}, D3RLPY: {"0": theirs}}
    (tmp_path / "quality.json").write_text(json.dumps({pendulum_dataset.name: entry}))

    result = cql_curves("--results", tmp_path, "--dataset", pendulum_dataset.name, "--out", tmp_path / "c.png")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 seeds of ours, 1 of d3rlpy's" in result.stdout
    assert (tmp_path / "c.png").stat().st_size > 0
    start = {title: value[D3RLPY](theirs[0], cell) for title, value in PANELS.items()}
    assert 0 < start["conservative weight"] <= 1 and math.isfinite(start["conservative gap"])
