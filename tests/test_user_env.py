"""A user's own environment, as a new user brings it: a class the pipeline has never seen, in their package on
PYTHONPATH (tests/fixtures/user_code), their controller as the behaviour policy and declared references. `dvc repro`
in a temp repo collects, trains BC and DQN, evaluates with normalized scores and runs OPE; the dataset exports
to Minari and imports back with the same rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import dataset_format as dataset
from dataset_format import Col
from tests.conftest import CORRIDOR, USER_CODE, copy_pipeline

pytestmark = pytest.mark.slow  # the real `dvc repro` of a whole pipeline

WALK_RIGHT = {"kind": "callable", "callable": "corridor_sim.control:walk_right"}


def run(cmd: list[str], cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def user_env(tmp_path_factory) -> dict:
    """The environment a user's shell has: our `orl` on PATH, their package on PYTHONPATH, their Minari store."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(USER_CODE), "MINARI_DATASETS_PATH": str(tmp_path_factory.mktemp("minari"))}
    env.pop("MLFLOW_TRACKING_URI", None)  # the default: sqlite:///mlflow.db in the repo
    return env


@pytest.fixture(scope="module")
def repo(tmp_path_factory, user_env) -> Path:
    root = tmp_path_factory.mktemp("repo")
    params = copy_pipeline(root)
    params["datasets"] = {"corridor-mixed": {
        "env": CORRIDOR.to_dict(), "episodes": 60, "seed": 0,
        "policy": {"kind": "mixture", "epsilon": 0.3, "base": WALK_RIGHT}}}
    params["references"] = {"Corridor": {"ceiling": WALK_RIGHT}}
    params["policy_datasets"], params["online_policies"], params["imports"] = {}, {}, {}
    params["collect"].update(episodes_per_task=10)
    params["train"]["runs"] = {f"{algo}-corridor-mixed": {"algo": algo, "dataset": "corridor-mixed"}
                              for algo in ("bc", "dqn")}
    params["algos"]["dqn"]["iterations"] = 10
    params["evaluate"]["episodes"] = 10
    params["ope"].update(hidden_layers=[32, 32], iterations=5, updates_per_iteration=10, bootstrap_samples=30)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "init", "-q"], root, user_env)
    run(["dvc", "init", "-q"], root, user_env)
    run(["dvc", "repro"], root, user_env)
    return root


def test_the_users_env_is_collected_with_their_controller_and_recorded_in_the_card(repo):
    card = dataset.validate(repo / "datasets" / "corridor-mixed")
    assert card.env_id == "Corridor" and card.env_spec == CORRIDOR.to_dict()
    assert card.behavior_policy["base"]["callable"] == "corridor_sim.control:walk_right"
    assert card.has_action_logp  # a deterministic controller, mixed: its log-probabilities are known
    arrays = dataset.load_arrays(repo / "datasets" / "corridor-mixed")
    assert np.mean(arrays[Col.ACTIONS] == 2) > 0.7  # mostly the controller's "right"
    reference = json.loads((repo / "references" / "Corridor.json").read_text())
    assert reference["expert"]["mean"] > reference["random"]["mean"]


def test_bc_and_dqn_train_and_are_evaluated_with_normalized_scores(repo):
    for algo in ("bc", "dqn"):
        metrics = json.loads((repo / "runs" / f"{algo}-corridor-mixed" / "eval.json").read_text())
        assert "normalized_score" in metrics, metrics
    assert json.loads((repo / "runs" / "bc-corridor-mixed" / "eval.json").read_text())["normalized_score"] >= 80
    summary = (repo / "reports" / "summary.md").read_text()
    assert "| Corridor | corridor-mixed | bc |" in summary and "| Corridor | corridor-mixed | dqn |" in summary


def test_ope_estimates_the_users_policies_in_normalized_units(repo):
    for algo in ("bc", "dqn"):
        ope = json.loads((repo / "runs" / f"{algo}-corridor-mixed" / "ope.json").read_text())
        assert ope["units"] == "normalized score" and ope["horizon"] == 30
        assert {"fqe", "wpdis", "dr"} <= set(ope["estimates"])


def test_mlflow_names_the_experiment_and_models_after_the_spec(repo):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("Corridor")
    assert sorted(r.data.params["algo"] for r in client.search_runs([experiment.experiment_id])) == ["bc", "dqn"]
    assert client.get_registered_model("Corridor-bc") is not None


def test_the_dataset_exports_to_minari_and_imports_back_with_the_same_rows(repo, user_env):
    run(["orl", "datasets", "export", "datasets/corridor-mixed", "--to", "minari", "--id", "user/corridor-mixed-v0"],
        repo, user_env)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["imports"] = {"corridor-back": {"format": "minari", "source": "user/corridor-mixed-v0",
                                           "env": CORRIDOR.to_dict()}}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["orl", "datasets", "import", "corridor-back", "--out", "back"], repo, user_env)
    original, back = (dataset.load_table(repo / path) for path in ("datasets/corridor-mixed", "back"))
    columns = [c for c in original.column_names if c != Col.ACTION_LOGP]  # Minari keeps no log-probabilities
    assert back.select(columns).equals(original.select(columns))
    assert dataset.read_card(repo / "back").env_spec == CORRIDOR.to_dict()
