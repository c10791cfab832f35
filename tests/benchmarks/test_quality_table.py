"""benchmarks/quality_table.py's table: a cell trained for a time budget (`--train-seconds`) says how many updates
its seeds made in it, as a cell with other settings says so; `--update` adds seeds only to a cell measured with the
same hyper-parameters, and keeps the evaluation returns of those seeds alone. Our learner's cell keeps the learner's
metrics at each progress line."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.quality_table import kept_episode_returns, kept_scores, markdown, train_ours
from pipelines.params import load_params
from tests.conftest import REPO


def test_a_time_budgeted_cell_gives_its_seeds_updates_and_the_budget():
    results = {"pong-expert": {
        "env_id": "ALE/Pong-v5",
        "scores": {"behaviour": [97.6], "bc": [58.0, 55.5], "cql_dqn": [-3.4, -3.2]},
        "overrides": {"bc": {"batch_size": 256}, "cql_dqn": {}},
        "train_seconds": {"bc": 210.0, "cql_dqn": None},
        "updates_made": {"bc": {"0": 17500, "1": 17000}, "cql_dqn": {"0": 25000, "1": 25000}},
    }}
    row = markdown(results, ["behaviour", "bc", "cql_dqn"]).splitlines()[-1]
    assert row == ("| ALE/Pong-v5 | pong-expert | 97.6 | 56.8 ± 1.2 (batch_size 256, 17,000-17,500 updates, a 210s "
                   "budget) | -3.3 ± 0.1 |")


def test_update_keeps_a_cells_seeds_only_where_params_yaml_gave_the_same_values():
    measured = {"overrides": {}, "updates_scale": 1, "sampled": False, "train_seconds": None,
                "hyper_parameters": {"lr": 0.001, "batch_size": 256}}
    entry = {"scores": {"bc": [14.2, 11.0]}, "seeds": {"bc": [0, 1]},
             **{key: {"bc": value} for key, value in measured.items()}}
    assert kept_scores(entry, "bc", measured) == {0: 14.2, 1: 11.0}
    params_changed = {**measured, "hyper_parameters": {"lr": 0.0003, "batch_size": 256}}
    assert kept_scores(entry, "bc", params_changed) == {}
    del entry["hyper_parameters"]  # measured before cells recorded their values: unknown, so not kept
    assert kept_scores(entry, "bc", measured) == {}


def test_update_keeps_the_episode_returns_of_the_seeds_it_keeps():
    entry = {"episode_returns": {"bc": {"0": [2700.0, 26.0], "1": [2650.0, 2690.0]}}}
    assert kept_episode_returns(entry, "bc", {1: 11.0}) == {"1": [2650.0, 2690.0]}
    assert kept_episode_returns(entry, "bc", {}) == {}
    assert kept_episode_returns({}, "bc", {0: 14.2}) == {}  # measured before cells recorded their returns


@pytest.mark.slow  # 25 tiny iterations
def test_our_learner_reports_its_metrics_at_each_progress_line_and_at_the_last_iteration(expert_dataset, tmp_path):
    bc = dataclasses.replace(load_params(REPO / "params.yaml").algos.get("bc"), iterations=25, updates_per_iteration=1,
                             hidden_layers=[16])
    updates, path = train_ours("bc", bc, expert_dataset, 0, tmp_path / "checkpoint")

    assert updates == 25
    # A line every 2 iterations of 25, the first's (it loads the data) and the last's, which no line falls on.
    assert [point["iteration"] for point in path] == [1, *range(2, 25, 2), 25]
    assert all(isinstance(point["policy_loss"], float) for point in path), path  # BC's loss, at every line
