"""The real `dvc repro` in a temporary git + DVC repo with tiny params: end to end through `orl repro` (as `make
pipeline` runs it, every stage on one Ray), then a no-op `dvc repro`. Beside CartPole, a user's own environment as a
new user brings it: a class the pipeline has never seen, in their package on PYTHONPATH (tests/fixtures/user_code),
their controller as the behaviour policy and declared references; its dataset exports to Minari and imports back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import dataset_format as dataset
from dataset_format import Col
from tests.conftest import CARTPOLE_CONTROLLER, CORRIDOR, TINY_OPE, USER_CODE, copy_pipeline

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
    """A copy of the project with small datasets, trained on the expert data and on the user's env."""
    root = tmp_path_factory.mktemp("repo")
    params = copy_pipeline(root)
    params["datasets"] = {
        "cartpole-expert": {"env": "CartPole-v1", "episodes": 20, "seed": 3, "policy": CARTPOLE_CONTROLLER},
        "corridor-mixed": {"env": CORRIDOR.to_dict(), "episodes": 60, "seed": 0,
                           "policy": {"kind": "mixture", "epsilon": 0.3, "base": WALK_RIGHT}},
    }
    params["references"]["Corridor"] = {"ceiling": WALK_RIGHT}
    # Collected with the DQN the pipeline trains on the expert data: DVC must order train -> collect.
    params["policy_datasets"] = {"cartpole-learned": {
        "env": "CartPole-v1", "episodes": 10, "seed": 5,
        "policy": {"kind": "model", "model": "runs/dqn-cartpole-expert/checkpoint"}}}
    # And with a PPO trained online to a low score: DVC must order reference -> train_online -> collect.
    params["online_policies"] = {"cartpole-ppo": {
        "env": "CartPole-v1", "target_score": 5, "max_env_steps": 50_000, "seed": 0, "batch_size": 1000,
        "minibatch_size": 100, "epochs": 5, "score_episodes": 10}}
    params["policy_datasets"]["cartpole-ppo"] = {
        "env": "CartPole-v1", "episodes": 10, "seed": 6,
        "policy": {"kind": "model", "model": "runs/ppo-cartpole-ppo/checkpoint"}}
    # And a log from elsewhere, with its own column names and no simulator: DVC tracks the file it imports.
    write_shop_log(root / "logs" / "shop.csv")
    params["imports"] = {"shop-log": {
        "format": "csv", "source": "logs/shop.csv",
        "observation_space": {"type": "Box", "low": [0.0, 0.0], "high": [100.0, 1.0]},
        "action_space": {"type": "Discrete", "n": 3},
        "columns": {"episode": "visitor", "step": "page", "obs": ["price", "stock"], "actions": ["offer"],
                    "rewards": "revenue", "terminated": "left"}}}
    params["collect"]["episodes_per_task"] = 10
    # dqn: the evaluation and report of a Q-learner
    params["train"]["runs"] = {f"{algo}-cartpole-expert": {"algo": algo, "dataset": "cartpole-expert"}
                               for algo in ("bc", "dqn")}
    params["train"]["runs"]["bc-corridor-mixed"] = {"algo": "bc", "dataset": "corridor-mixed"}
    params["algos"]["dqn"]["iterations"] = 5
    params["evaluate"]["episodes"] = 10
    # FQE iterates over the corridor's whole horizon (30 steps), carrying its rewards back to the first step: only
    # then do the estimates that `orl select` compares mean something, and FQE's heads agree on them.
    params["ope"].update(TINY_OPE, iterations=30)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "init", "-q"], root, user_env)
    run(["dvc", "init", "-q"], root, user_env)
    run(["orl", "repro"], root, user_env)
    return root


def write_shop_log(path: Path) -> None:
    """Six visitors of a made-up shop, 4 to 9 pages each."""
    rng = np.random.default_rng(0)
    rows = [{"visitor": f"v{visitor}", "page": page, "price": rng.uniform(0, 100), "stock": rng.uniform(0, 1),
             "offer": int(rng.integers(3)), "revenue": rng.uniform(0, 5), "left": page == pages - 1}
            for visitor, pages in enumerate(rng.integers(4, 10, size=6)) for page in range(pages)]
    path.parent.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(path, index=False)


def test_repro_produces_datasets_runs_and_report(repo):
    assert {p.name for p in (repo / "datasets").iterdir() if p.is_dir()} == {
        "cartpole-expert", "corridor-mixed", "cartpole-learned", "cartpole-ppo", "shop-log",
        "cartpole-ppo-replay"}  # the train_online stage's replay of every episode PPO trained on
    replay = dataset.validate(repo / "datasets" / "cartpole-ppo-replay")
    assert replay.env_id == "CartPole-v1" and replay.behavior_policy["kind"] == "logged"
    shop = dataset.validate(repo / "datasets" / "shop-log")
    assert shop.env_id is None and shop.episodes == 6 and shop.source["path"] == "logs/shop.csv"
    summary = (repo / "reports" / "summary.md").read_text()
    assert "| CartPole-v1 | cartpole-expert | bc |" in summary
    assert "| CartPole-v1 | cartpole-expert | dqn |" in summary
    for image in ("scores.png", "returns.png", "learning_curves.png"):
        assert (repo / "reports" / image).stat().st_size > 1000
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert "collect@cartpole-expert" in lock["stages"] and "report" in lock["stages"]
    assert "logs/shop.csv" in [dep["path"] for dep in lock["stages"]["import@shop-log"]["deps"]]
    learned = lock["stages"]["collect_from_policy@cartpole-learned"]
    assert "runs/dqn-cartpole-expert/checkpoint" in [dep["path"] for dep in learned["deps"]]
    card = dataset.read_card(repo / "datasets" / "cartpole-learned")
    assert card.behavior_policy["model"] == "runs/dqn-cartpole-expert/checkpoint" and card.episodes == 10
    online = lock["stages"]["collect_from_policy@cartpole-ppo"]
    assert "runs/ppo-cartpole-ppo/checkpoint" in [dep["path"] for dep in online["deps"]]
    assert "references" in [dep["path"] for dep in lock["stages"]["train_online@cartpole-ppo"]["deps"]]
    assert json.loads((repo / "runs" / "ppo-cartpole-ppo" / "train_metrics.json").read_text())["normalized_score"] >= 5


def test_ope_estimates_every_run_and_the_report_sets_them_against_the_true_scores(repo):
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    for algo in ("bc", "dqn"):
        assert f"ope@{algo}-cartpole-expert" in lock["stages"]
        ope = json.loads((repo / "runs" / f"{algo}-cartpole-expert" / "ope.json").read_text())
        assert ope["dataset"] == "cartpole-expert" and ope["units"] == "normalized score"
        assert ope["episodes"]["estimated_on"] == ope["episodes"]["total"] > 0  # no held-out split by default
        assert {"fqe", "wpdis", "dr", "model"} <= set(ope["estimates"])  # their values: tests/evaluation/test_ope.py
    summary = (repo / "reports" / "summary.md").read_text()
    # Pooled over the three offline runs, the user's env's included.
    assert "## Off-policy estimates" in summary and "| **fqe** | **pooled** (regret: median) | 3 |" in summary
    # Validated: the estimators that gave numbers (wpdis is "unreliable" where greedy policies collapse its weights),
    # and `orl select`'s default reading of FQE and the model together.
    assert {"fqe", "dr", "model", "fqe+model"} <= set(json.loads((repo / "reports" / "ope.json").read_text())) <= {
        "fqe", "wpdis", "dr", "model", "fqe+model"}
    assert (repo / "reports" / "ope.png").stat().st_size > 1000


def test_bc_clones_the_expert(repo):
    metrics = json.loads((repo / "runs" / "bc-cartpole-expert" / "eval.json").read_text())
    assert metrics["normalized_score"] >= 90, metrics


def test_runs_are_in_the_default_sqlite_store(repo):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("CartPole-v1")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.params["algo"] for r in runs) == ["bc", "dqn", "ppo"]
    offline = [r for r in runs if r.data.params["algo"] != "ppo"]
    assert all("eval/normalized_score" in r.data.metrics for r in offline)
    assert all({"ope/fqe", "ope/fqe_ci_low", "ope/fqe_ci_high", "ope/dr"} <= set(r.data.metrics) for r in offline)
    assert all(r.data.tags["ope.dataset"] == "cartpole-expert" for r in offline)
    [online] = [r for r in runs if r.data.params["algo"] == "ppo"]
    assert online.data.tags["purpose"] == "behaviour policy" and "normalized_score" in online.data.metrics
    assert (repo / "mlartifacts").is_dir()
    assert str(client.get_model_version_by_alias("CartPole-v1-bc", "cartpole-expert").version) == "1"


def test_the_users_env_is_collected_with_their_controller_and_recorded_in_the_card(repo):
    card = dataset.validate(repo / "datasets" / "corridor-mixed")
    assert card.env_id == "Corridor" and card.env_spec == CORRIDOR.to_dict()
    assert card.behavior_policy["base"]["callable"] == "corridor_sim.control:walk_right"
    assert card.has_action_logp  # a deterministic controller, mixed: its log-probabilities are known
    arrays = dataset.load_arrays(repo / "datasets" / "corridor-mixed")
    assert np.mean(arrays[Col.ACTIONS] == 2) > 0.7  # mostly the controller's "right"
    reference = json.loads((repo / "references" / "Corridor.json").read_text())
    assert reference["expert"]["mean"] > reference["random"]["mean"]


def test_bc_on_the_users_env_is_evaluated_and_estimated_in_normalized_units(repo):
    metrics = json.loads((repo / "runs" / "bc-corridor-mixed" / "eval.json").read_text())
    assert metrics["normalized_score"] >= 80, metrics
    assert "| Corridor | corridor-mixed | bc |" in (repo / "reports" / "summary.md").read_text()
    ope = json.loads((repo / "runs" / "bc-corridor-mixed" / "ope.json").read_text())
    assert ope["units"] == "normalized score" and ope["horizon"] == 30
    assert {"fqe", "wpdis", "dr", "model"} <= set(ope["estimates"])


def test_mlflow_names_the_experiment_and_models_after_the_users_spec(repo):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("Corridor")
    assert [r.data.params["algo"] for r in client.search_runs([experiment.experiment_id])] == ["bc"]
    assert client.get_registered_model("Corridor-bc") is not None


def test_select_picks_bc_on_the_users_env_and_nothing_on_expert_data(repo, user_env):
    """BC walks right every time, the data's behaviour only mostly: the estimates tell them apart. On the expert's
    data nothing can beat the expert that logged it."""
    result = run(["orl", "select", "--dataset", "corridor-mixed", "--by", "fqe"], repo, user_env)
    assert ("alias corridor-mixed-ope-best -> models:/Corridor-bc/1 (run bc-corridor-mixed, the highest lower bound by "
            "fqe; the only candidate)") in result.stderr
    refused = subprocess.run(["orl", "select", "--dataset", "cartpole-expert", "--by", "fqe"], cwd=repo, env=user_env,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "no run on dataset 'cartpole-expert' stands above its behaviour policy" in refused.stderr.splitlines()[-1]


def test_the_users_dataset_exports_to_minari_and_imports_back_with_the_same_rows(repo, user_env, tmp_path):
    run(["orl", "datasets", "export", "datasets/corridor-mixed", "--to", "minari", "--id", "user/corridor-mixed-v0"],
        repo, user_env)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["imports"] = {"corridor-back": {"format": "minari", "source": "user/corridor-mixed-v0",
                                           "env": CORRIDOR.to_dict()}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))  # the repo's own stays as it is
    run(["orl", "--params", str(tmp_path / "params.yaml"), "datasets", "import", "corridor-back", "--out",
         str(tmp_path / "back")], repo, user_env)
    original, back = dataset.load_table(repo / "datasets" / "corridor-mixed"), dataset.load_table(tmp_path / "back")
    columns = [c for c in original.column_names if c != Col.ACTION_LOGP]  # Minari keeps no log-probabilities
    assert back.select(columns).equals(original.select(columns))
    assert dataset.read_card(tmp_path / "back").env_spec == CORRIDOR.to_dict()


def test_second_repro_does_nothing_and_metrics_show(repo, user_env):
    result = run(["dvc", "repro"], repo, user_env)
    assert "Data and pipelines are up to date." in result.stdout
    assert "Running stage" not in result.stdout
    shown = run(["dvc", "metrics", "show", "--json"], repo, user_env)
    assert "normalized_score" in shown.stdout
