"""Logs in CSV and Parquet with the user's own column names, imported as datasets; a log without a simulator
trains, and evaluation skips it with its reason."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

import dataset_format as dataset
from common.errors import UserError
from evaluation.report import NO_EVALUATED_RUN
from interop.config import ColumnMapping, ImportConfig, SpaceConfig
from interop.importing import import_dataset
from tests.conftest import TINY_OPE, assert_user_error, orl

OBS_NAMES = ["cart_x", "cart_v", "pole_angle", "pole_v"]
COLUMNS = ColumnMapping(episode="session", step="tick", obs=OBS_NAMES, actions=["push"], rewards="gain",
                        terminated="fell")
UNBOUNDED = SpaceConfig(type="Box", low=[-np.inf] * 4, high=[np.inf] * 4)
NO_ENV = ImportConfig(format="csv", source="log.csv", observation_space=UNBOUNDED,
                      action_space=SpaceConfig(type="Discrete", n=2), columns=COLUMNS,
                      behavior_policy="the shop's controller")


def log_frame(expert_dataset) -> pd.DataFrame:
    """The expert dataset as a production system might log it: its own names, string session ids, steps from 1,
    no next observation."""
    arrays = dataset.load_arrays(expert_dataset)
    frame = pd.DataFrame(arrays[dataset.Col.OBS], columns=OBS_NAMES)
    frame.insert(0, "session", [f"user-{i}" for i in arrays[dataset.Col.EPS_ID]])
    frame.insert(1, "tick", arrays[dataset.Col.T] + 1)
    frame["push"] = arrays[dataset.Col.ACTIONS]
    frame["gain"] = arrays[dataset.Col.REWARDS]
    frame["fell"] = arrays[dataset.Col.TERMINATEDS]
    return frame


@pytest.fixture
def log_dir(tmp_path, expert_dataset):
    log_frame(expert_dataset).to_csv(tmp_path / "log.csv", index=False)
    return tmp_path


def test_a_csv_log_becomes_the_same_transitions(log_dir, expert_dataset, monkeypatch):
    monkeypatch.chdir(log_dir)
    card = import_dataset("shop", NO_ENV, log_dir / "shop", file_bytes=2**20)
    original, imported = dataset.load_arrays(expert_dataset), dataset.load_arrays(log_dir / "shop")
    for column in (dataset.Col.OBS, dataset.Col.ACTIONS, dataset.Col.REWARDS, dataset.Col.TERMINATEDS):
        np.testing.assert_array_equal(imported[column], original[column])
    # new_obs is the next row's obs within an episode; the log has none after an episode's last step.
    last = np.r_[original[dataset.Col.EPS_ID][1:] != original[dataset.Col.EPS_ID][:-1], True]
    np.testing.assert_array_equal(imported[dataset.Col.NEW_OBS][~last], original[dataset.Col.NEW_OBS][~last])
    np.testing.assert_array_equal(imported[dataset.Col.TRUNCATEDS], original[dataset.Col.TRUNCATEDS])
    assert card.env_id is None and card.seed is None and card.episodes == 20
    assert card.behavior_policy == {"kind": "logged", "description": "the shop's controller"}
    assert card.source["format"] == "csv" and card.source["columns"]["obs"] == OBS_NAMES

    import_dataset("shop", NO_ENV, log_dir / "again", file_bytes=2**20)
    for name in ("_card.json", *(f["path"] for f in card.files)):
        assert (log_dir / "again" / name).read_bytes() == (log_dir / "shop" / name).read_bytes()


def test_a_parquet_log_with_a_list_column_and_an_env(tmp_path, expert_dataset, monkeypatch):
    frame = log_frame(expert_dataset)
    frame["state"] = list(frame[OBS_NAMES].to_numpy())
    frame.drop(columns=OBS_NAMES).to_parquet(tmp_path / "log.parquet")
    monkeypatch.chdir(tmp_path)
    config = ImportConfig(format="parquet", source="log.parquet", env="CartPole-v1",
                          columns=ColumnMapping(episode="session", step="tick", obs=["state"], actions=["push"],
                                                rewards="gain", terminated="fell"))
    card = import_dataset("shop", config, tmp_path / "shop", file_bytes=2**20)
    assert card.env_id == "CartPole-v1" and card.transitions == 10_000
    np.testing.assert_array_equal(dataset.load_arrays(tmp_path / "shop")[dataset.Col.OBS],
                                  dataset.load_arrays(expert_dataset)[dataset.Col.OBS])


def _rows_swapped(frame: pd.DataFrame) -> pd.DataFrame:
    order = list(range(len(frame)))
    order[3], order[4] = order[4], order[3]
    return frame.iloc[order]


def _interleaved(frame: pd.DataFrame) -> pd.DataFrame:
    first, second = frame[frame.session == "user-0"], frame[frame.session == "user-1"]
    return pd.concat([first.iloc[:10], second.iloc[:10], first.iloc[10:], second.iloc[10:],
                      frame[~frame.session.isin(["user-0", "user-1"])]])


def _with_inf(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    frame.loc[7, "pole_v"] = np.inf
    return frame


def _with_empty(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    frame.loc[9, "gain"] = np.nan  # written as an empty CSV field
    return frame


@pytest.mark.parametrize(("spoil", "config", "message"), [
    (lambda f: f.drop(columns=["gain"]), NO_ENV, "log.csv: column 'gain' named in `columns` is missing"),
    (_rows_swapped, NO_ENV, "log.csv: column 'tick' at row 3 is 5 after 3 in episode 'user-0'"),
    (_interleaved, NO_ENV, "log.csv: column 'session' at row 20 resumes episode 'user-0'"),
    (_with_inf, NO_ENV, "log.csv: column 'pole_v' at row 7 holds NaN or inf"),
    (_with_empty, NO_ENV, "log.csv: column 'gain' at row 9 is empty"),
    (lambda f: f, ImportConfig(format="csv", source="log.csv", env="CartPole-v1",
                               columns=ColumnMapping(episode="session", step="tick", obs=OBS_NAMES[:3],
                                                     actions=["push"], rewards="gain", terminated="fell")),
     "columns.obs gives 3 values per row ('cart_x' 1, 'cart_v' 1, 'pole_angle' 1) where the space needs 4"),
    (lambda f: f.assign(push=f.push * 3), NO_ENV, "log.csv: column 'push' at row"),
])
def test_bad_logs_are_refused_naming_file_column_and_row(tmp_path, expert_dataset, monkeypatch, spoil, config,
                                                         message):
    spoil(log_frame(expert_dataset)).to_csv(tmp_path / "log.csv", index=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        import_dataset("shop", config, tmp_path / "datasets" / "shop", file_bytes=2**20)
    assert not (tmp_path / "datasets").exists() or not any((tmp_path / "datasets").iterdir())


def write_params(directory, imports: dict) -> None:
    tiny = {"iterations": 2, "updates_per_iteration": 5, "batch_size": 64, "hidden_layers": [16]}
    (directory / "params.yaml").write_text(yaml.safe_dump({
        "datasets": {}, "imports": imports, "algos": {"bc": tiny}, "train": {"checkpoint_every": 10},
        "evaluate": {"episodes": 2, "num_workers": 1},
        "ope": TINY_OPE,
    }))


def import_config_dict(config: ImportConfig) -> dict:
    from dataclasses import asdict

    return {key: value for key, value in asdict(config).items() if value not in (None, "")}


@pytest.mark.slow  # trains, then evaluates
def test_a_log_without_a_simulator_trains_and_evaluation_says_why_it_skips(log_dir):
    write_params(log_dir, {"shop-log": import_config_dict(NO_ENV)})
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{log_dir / 'mlflow.db'}"}
    result = orl("datasets", "import", "shop-log", cwd=log_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "(no simulator)" in result.stderr
    result = orl("train", "--algo", "bc", "--dataset", "datasets/shop-log", cwd=log_dir, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((log_dir / "runs" / "bc-shop-log" / "run.json").read_text())
    assert info["env_id"] is None and info["registered_model"]["name"] == "shop-log-bc"
    result = orl("evaluate", "runs/bc-shop-log", cwd=log_dir, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    skipped = json.loads((log_dir / "runs" / "bc-shop-log" / "eval.json").read_text())["skipped"]
    assert "dataset shop-log has no simulator" in skipped and skipped in result.stderr
    assert (log_dir / "runs" / "bc-shop-log" / "eval_returns.png").stat().st_size > 1000
    # What the data says of the policy instead: its off-policy estimates, in returns, are what the report shows.
    result = orl("ope", "runs/bc-shop-log", "--dataset", "datasets/shop-log", cwd=log_dir, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    estimates = json.loads((log_dir / "runs" / "bc-shop-log" / "ope.json").read_text())["estimates"]
    fqe, model = estimates["fqe"]["value"], estimates["model"]["value"]
    result = orl("report", cwd=log_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = (log_dir / "reports" / "summary.md").read_text()
    # No true score, and no importance sampling without the behaviour's probabilities: dr | fqe | model | wpdis.
    assert NO_EVALUATED_RUN in summary
    assert f"| bc-shop-log | shop-log | - | - | {fqe:.1f} | {model:.1f} | - |" in summary


def test_a_bad_import_exits_2_with_one_line_and_writes_nothing(log_dir):
    write_params(log_dir, {"shop-log": import_config_dict(NO_ENV) | {"source": "missing.csv"}})
    assert_user_error(orl("datasets", "import", "shop-log", cwd=log_dir), "missing.csv does not exist")
    assert not (log_dir / "datasets").exists()
