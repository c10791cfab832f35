"""benchmarks/quality_table.py's table: a cell trained for a time budget (`--train-seconds`) says how many updates
its seeds made in it, as a cell with other settings says so; `--update` adds seeds only to a cell measured with the
same hyper-parameters, and keeps the evaluation returns of those seeds alone; `--pool` joins the seeds of runs made
apart, refusing what one cell cannot hold. A cell keeps its learner's metrics at each progress line, d3rlpy's too.
`--initial-weights` starts our CQL alone, from a file. `--keep-checkpoints` keeps our policies and d3rlpy's CQL's
weights."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import yaml

from benchmarks.quality_table import (
    D3RLPY_PYTHON,
    kept_episode_returns,
    kept_scores,
    main,
    markdown,
    pool,
    train_d3rlpy,
    train_ours,
)
from common.errors import UserError
from pipelines.params import load_params
from tests.conftest import REPO, run_benchmark


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


def _run(column: str, seed: int, score: float, lr: float = 0.0003) -> dict:
    """A quality table of one run: `column` on halfcheetah-random, one training seed."""
    cell = {"overrides": {"iterations": 50}, "updates_scale": 1, "sampled": False, "train_seconds": None,
            "hyper_parameters": {"lr": lr}}
    return {"halfcheetah-random": {
        "env_id": "HalfCheetah-v5", "reference": {"random": {"mean": -280.2}},
        "scores": {"behaviour": [1.2], column: [score]}, "seeds": {column: [seed]},
        **{key: {column: value} for key, value in cell.items()},
        "episode_returns": {column: {str(seed): [score * 100]}},
    }}


def test_pool_joins_a_cells_seeds_measured_in_separate_runs():
    pooled = pool({"a": _run("cql", 1, 10.0), "b": _run("cql", 0, 8.0), "c": _run("d3rlpy-cql", 0, 12.0)}, ["cql"])

    entry = pooled["halfcheetah-random"]
    assert entry["seeds"] == {"cql": [0, 1]} and entry["scores"] == {"behaviour": [1.2], "cql": [8.0, 10.0]}
    assert entry["episode_returns"] == {"cql": {"1": [1000.0], "0": [800.0]}}
    assert entry["overrides"] == {"cql": {"iterations": 50}}  # d3rlpy's cell, not asked for, is left out


def test_pool_refuses_a_cell_of_other_settings_a_seed_twice_and_other_data():
    with pytest.raises(UserError, match=r"b: halfcheetah-random's cql was measured with other settings than the runs "
                                        r"before it \(hyper_parameters: lr 0.001 against 0.0003\)"):
        pool({"a": _run("cql", 0, 8.0), "b": _run("cql", 1, 10.0, lr=0.001)})
    newer = _run("cql", 1, 10.0)  # a hyper-parameter added since the first run, and another --set
    newer["halfcheetah-random"]["hyper_parameters"]["cql"]["temperature_lr"] = 0.0003
    newer["halfcheetah-random"]["overrides"]["cql"]["iterations"] = 100
    with pytest.raises(UserError, match=r"\(overrides: iterations 100 against 50; hyper_parameters: temperature_lr "
                                        r"0.0003 against absent\)"):
        pool({"a": _run("cql", 0, 8.0), "b": newer})
    with pytest.raises(UserError, match="b: halfcheetah-random's cql seed 0 is in an earlier run too"):
        pool({"a": _run("cql", 0, 8.0), "b": _run("cql", 0, 8.5)})
    recollected = _run("cql", 1, 10.0)
    recollected["halfcheetah-random"]["scores"]["behaviour"] = [0.9]
    with pytest.raises(UserError, match="b: halfcheetah-random was measured on other data or references"):
        pool({"a": _run("cql", 0, 8.0), "b": recollected})


def test_pool_with_update_keeps_outs_own_cells_and_writes_the_table(tmp_path, monkeypatch):
    for name, table in {"out": _run("d3rlpy-cql", 0, 12.0), "seed0": _run("cql", 0, 8.0),
                        "seed1": _run("cql", 1, 10.0)}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "quality.json").write_text(json.dumps(table))
    monkeypatch.setattr(sys, "argv", ["quality_table.py", "--params", str(REPO / "params.yaml"), "--update", "--pool",
                                      str(tmp_path / "seed0"), str(tmp_path / "seed1"), "--out", str(tmp_path / "out")])
    main()

    assert json.loads((tmp_path / "out" / "quality.json").read_text())["halfcheetah-random"]["seeds"] == {
        "d3rlpy-cql": [0], "cql": [0, 1]}
    row = "| HalfCheetah-v5 | halfcheetah-random | 1.2 | 9.0 ± 1.0 (iterations 50, 2 seeds) | 12.0 (iterations 50) |"
    assert row in (tmp_path / "out" / "quality.md").read_text().splitlines()
    assert (tmp_path / "out" / "quality.png").stat().st_size > 0


@pytest.mark.parametrize("algos, weights, message", [
    (["cql"], "no.pt", "no.pt is no file; write one with cql_one_update.py --save-weights"),
    (["cql", "iql", "d3rlpy-cql"], "weights.pt", "starts our CQL alone: add --algos naming cql and no other"),
    ([], "weights.pt", "starts our CQL alone")])
def test_initial_weights_start_our_cql_alone_from_a_file(algos, weights, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "weights.pt").write_bytes(b"")
    monkeypatch.setattr(sys, "argv", ["quality_table.py", *(["--algos", *algos] if algos else []),
                                      "--initial-weights", str(tmp_path / weights), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as stopped:
        main()

    assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # 25 tiny iterations
def test_our_learner_reports_its_metrics_at_each_progress_line_and_at_the_last_iteration(expert_dataset, tmp_path):
    bc = dataclasses.replace(load_params(REPO / "params.yaml").algos.get("bc"), iterations=25, updates_per_iteration=1,
                             hidden_layers=[16])
    updates, path = train_ours("bc", bc, expert_dataset, 0, tmp_path / "checkpoint")

    assert updates == 25
    # A line every 2 iterations of 25, the first's (it loads the data) and the last's.
    assert [point["iteration"] for point in path] == [1, *range(2, 25, 2), 25]
    assert all(isinstance(point["policy_loss"], float) for point in path), path  # BC's loss, at every line


@pytest.mark.slow  # d3rlpy's virtualenv starts and trains 50 tiny updates
@pytest.mark.skipif(not D3RLPY_PYTHON.exists(), reason="no d3rlpy virtualenv (make .venv-d3rlpy/.installed)")
def test_d3rlpy_reports_its_own_metrics_where_ours_are_kept(expert_dataset):
    bc = dataclasses.replace(load_params(REPO / "params.yaml").algos.get("bc"), iterations=25, updates_per_iteration=2,
                             hidden_layers=[16])
    returns, path = train_d3rlpy(str(D3RLPY_PYTHON), "d3rlpy-bc", bc, expert_dataset, 0, [1, 2], {})

    assert len(returns) == 2
    assert [point["iteration"] for point in path] == [1, *range(2, 25, 2), 25]  # an epoch of 2 updates each
    assert all(isinstance(point["loss"], float) for point in path), path  # d3rlpy's BC loss, by its own name


@pytest.mark.slow  # both CQLs trained a few updates, d3rlpy's in its own virtualenv, and evaluated
@pytest.mark.skipif(not D3RLPY_PYTHON.exists(), reason="no d3rlpy virtualenv (make .venv-d3rlpy/.installed)")
def test_keep_checkpoints_keeps_our_policy_and_d3rlpys_cql_weights_by_dataset_learner_and_seed(pendulum_dataset,
                                                                                                tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["algos"]["cql"].update(iterations=2, updates_per_iteration=2, hidden_layers=[16], batch_size=32)
    params["evaluate"]["episodes"] = 1
    params["references"] = {"Pendulum-v1": {"ceiling": {"kind": "callable",
                                                        "callable": "examples.controllers:pendulum"}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))

    result = run_benchmark("quality_table", "--params", tmp_path / "params.yaml", "--datasets-dir",
                           pendulum_dataset.parent, "--datasets", pendulum_dataset.name, "--references",
                           tmp_path / "references", "--algos", "cql", "d3rlpy-cql", "--seeds", 0, "--keep-checkpoints",
                           tmp_path / "kept", "--out", tmp_path / "out")

    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(path.name for path in (tmp_path / "kept").iterdir()) == [
        "pendulum-medium-cql-seed0", "pendulum-medium-d3rlpy-cql-seed0.pt"]
    assert json.loads((tmp_path / "out" / "quality.json").read_text())["pendulum-medium"]["seeds"] == {
        "cql": [0], "d3rlpy-cql": [0]}
