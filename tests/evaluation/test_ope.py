"""`orl ope` and `orl select` on tiny trained runs: estimates with intervals, MLflow metrics, the registry alias,
and the one-line refusals."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

import dataset_format as dataset
from common.errors import UserError
from common.run_dir import RunDir
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from evaluation.config import EvaluateConfig, OPEConfig
from evaluation.estimators import Episodes
from evaluation.model_based import fit_dynamics
from evaluation.ope import UNRELIABLE, estimate_policy, logged_episodes, ope
from evaluation.references import reference_path
from interop.config import ColumnMapping, ImportConfig
from interop.importing import import_dataset
from tests.conftest import REPO, TINY_OPE, assert_user_error, orl
from tests.evaluation.test_evaluate import REFERENCE
from tests.interop.test_logs import NO_ENV, log_frame

pytestmark = pytest.mark.slow  # two trainings, then `orl ope` and `orl select` on them

DATASET = "cartpole-expert"


@pytest.fixture(scope="module")
def project(expert_dataset, tmp_path_factory) -> Path:
    """A working directory with the expert data, BC and DQN trained on it for a few updates each, and references
    for the evaluation seeds (their numbers only set the units)."""
    root = tmp_path_factory.mktemp("ope")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for algo in ("bc", "dqn"):
        params["algos"][algo].update(iterations=2, updates_per_iteration=5, hidden_layers=[32])
    params["ope"].update(TINY_OPE)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.copytree(expert_dataset, root / "datasets" / DATASET)
    evaluate = EvaluateConfig(**params["evaluate"])
    reference = reference_path(root / "references", "CartPole-v1")
    reference.parent.mkdir()
    reference.write_text(json.dumps({**REFERENCE, "seed": evaluate.seed, "episodes": evaluate.episodes}))
    for algo in ("bc", "dqn"):
        trained = orl("train", "--algo", algo, "--dataset", f"datasets/{DATASET}", "--out", f"runs/{algo}", cwd=root,
                      timeout=600)
        assert trained.returncode == 0, trained.stderr[-3000:]
    return root


def tracking(project: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{project / 'mlflow.db'}")


@pytest.fixture(scope="module")
def estimated(project) -> dict[str, dict]:
    """`orl ope` of both runs on their dataset: ope.json by algorithm."""
    results = {}
    for algo in ("bc", "dqn"):
        result = orl("ope", f"runs/{algo}", "--dataset", f"datasets/{DATASET}", cwd=project)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"[ope {algo}] fqe: " in result.stderr
        results[algo] = json.loads((project / "runs" / algo / "ope.json").read_text())
    return results


def test_ope_estimates_each_estimator_inside_its_interval_in_normalized_units(estimated):
    for algo, output in estimated.items():
        assert output["dataset"] == DATASET and output["units"] == "normalized score"
        assert output["episodes"]["estimated_on"] == output["episodes"]["total"] == 20  # no held-out split
        for name in ("fqe", "wpdis", "dr", "model"):  # expert data logs action_logp (0: deterministic)
            estimate = output["estimates"][name]
            if estimate.get("status") == UNRELIABLE:  # wpdis whose weights collapsed: no number
                assert name == "wpdis" and estimate["effective_episodes"] < OPEConfig().min_effective_episodes, (
                    algo, estimate)
                continue
            assert "value" in estimate, (algo, name, estimate)
            assert estimate["ci_low"] <= estimate["value"] <= estimate["ci_high"], (algo, name, estimate)


def test_ope_logs_its_estimates_to_the_run(project, estimated):
    client = tracking(project)
    for algo, output in estimated.items():
        run_id = json.loads((project / "runs" / algo / "run.json").read_text())["mlflow_run_id"]
        run = client.get_run(run_id)
        assert run.data.metrics["ope/fqe"] == pytest.approx(output["estimates"]["fqe"]["value"])
        assert {"ope/fqe_ci_low", "ope/fqe_ci_high", "ope/wpdis", "ope/dr", "ope/model"} <= set(run.data.metrics)
        assert run.data.metrics["ope/behaviour_ci_high"] == pytest.approx(output["behaviour"]["ci_high"])
        assert run.data.tags["ope.dataset"] == DATASET


def test_select_refuses_when_no_run_stands_above_the_behaviour_policy(project, estimated):
    """On expert data no policy can be shown to beat the expert that logged it: one line, and no alias set (the
    pick on data where a run does stand above: tests/test_dvc_pipeline.py)."""
    behaviour = estimated["bc"]["behaviour"]
    assert behaviour == estimated["dqn"]["behaviour"]  # the data's own returns, whichever policy is estimated
    assert behaviour["ci_low"] <= behaviour["value"] == pytest.approx(100) and behaviour["return"] == 500
    dr = {algo: output["estimates"]["dr"] for algo, output in estimated.items()}
    best = max(dr, key=lambda algo: dr[algo]["ci_low"])
    result = orl("select", "--dataset", DATASET, "--by", "dr", cwd=project)
    assert_user_error(result, f"no run on dataset '{DATASET}' stands above its behaviour policy: the highest lower "
                      f"bound, {dr[best]['ci_low']:.1f} (dr of {best}-{DATASET})", "no alias set")
    assert f"] {best}-{DATASET}: ope/dr " in result.stderr and "<- the highest lower bound" in result.stderr
    for algo in ("bc", "dqn"):
        assert f"{DATASET}-ope-best" not in tracking(project).get_registered_model(f"CartPole-v1-{algo}").aliases


def test_select_by_default_asks_fqe_and_the_model_together(project, estimated):
    """Without --by, a run counts at the interval FQE and the model-based estimator agree on, from its lowest lower
    bound to its highest upper bound: picked only where both put it above the behaviour policy."""
    result = orl("select", "--dataset", DATASET, cwd=project)
    agreed = {}
    for algo, output in estimated.items():
        fqe, model = (output["estimates"][name] for name in ("fqe", "model"))
        agreed[algo] = (min(fqe["value"], model["value"]), min(fqe["ci_low"], model["ci_low"]),
                        max(fqe["ci_high"], model["ci_high"]))
        assert (f"] {algo}-{DATASET}: ope/fqe {fqe['value']:.1f} [{fqe['ci_low']:.1f}, {fqe['ci_high']:.1f}], "
                f"ope/model {model['value']:.1f} [{model['ci_low']:.1f}, {model['ci_high']:.1f}] -> fqe+model "
                "{:.1f} [{:.1f}, {:.1f}]".format(*agreed[algo])) in result.stderr
    best = max(agreed, key=lambda algo: (agreed[algo][1], agreed[algo][0]))  # the highest lower bound, then estimate
    assert_user_error(result, f"no run on dataset '{DATASET}' stands above its behaviour policy: the highest lower "
                      f"bound, {agreed[best][1]:.1f} (fqe+model of {best}-{DATASET})", "no alias set")


def test_select_without_estimates_says_to_run_ope_first(project):
    assert_user_error(orl("select", "--dataset", "nothing-here", "--by", "fqe", cwd=project),
                      "no finished MLflow run trained on dataset 'nothing-here' has the metric ope/fqe",
                      "run `orl ope`")


def test_ope_refuses_data_of_another_task_in_one_line(project, expert_dataset, tmp_path):
    log_frame(expert_dataset).to_csv(tmp_path / "log.csv", index=False)  # a log with no simulator behind it
    import_dataset("shop-log", dataclasses.replace(NO_ENV, source=str(tmp_path / "log.csv")), tmp_path / "shop-log",
                   file_bytes=2**20)
    result = orl("ope", "runs/bc", "--dataset", str(tmp_path / "shop-log"), cwd=project)
    assert_user_error(result, f"{tmp_path / 'shop-log'} holds data without an env but runs/bc was trained on "
                      "CartPole-v1 episodes; pass a dataset of the same env")


@pytest.mark.parametrize("command", [["ope", "runs/bc", "--dataset", f"datasets/{DATASET}"],
                                     ["evaluate", "runs/bc"]])
def test_a_run_missing_from_the_tracking_store_is_named_in_one_line(project, command):
    """Another store than the one `orl train` logged to (a deleted mlflow.db, a new server): refused before any
    work, and the run's outputs stay as they were."""
    def files() -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in (project / "runs" / "bc").rglob("*") if p.is_file()}

    before = files()
    result = orl(*command, cwd=project, env={"MLFLOW_TRACKING_URI": f"sqlite:///{project / 'other.db'}"})
    assert_user_error(result, "runs/bc/run.json names MLflow run ", f"which the tracking store sqlite:///{project}",
                      "set MLFLOW_TRACKING_URI to the store `orl train` logged to")
    assert files() == before


def test_ope_refuses_estimators_the_data_cannot_support_in_one_line(project, tmp_path):
    # CartPole episodes logged without their behaviour policy's probabilities.
    log = pd.DataFrame({"episode": [0, 0, 1], "step": [0, 1, 0], "x": [0.0, 0.01, 0.02], "v": 0.0, "a": 0.01,
                        "w": 0.0, "push": [1, 0, 1], "reward": 1.0, "fell": [False, True, True]})
    log.to_csv(tmp_path / "log.csv", index=False)
    no_logp = import_dataset("no-logp", ImportConfig(
        format="csv", source=str(tmp_path / "log.csv"), env="CartPole-v1",
        columns=ColumnMapping(episode="episode", step="step", obs=["x", "v", "a", "w"], actions=["push"],
                              rewards="reward", terminated="fell")), tmp_path / "no-logp", file_bytes=2**20)
    assert not no_logp.has_action_logp
    bc, references = project / "runs" / "bc", project / "references"
    evaluate = EvaluateConfig(**yaml.safe_load((project / "params.yaml").read_text())["evaluate"])
    with pytest.raises(UserError, match=r"^wpdis cannot evaluate .*bc on .*no-logp: no-logp has no action_logp "
                                        r"column .*; use fqe$"):
        ope(bc, str(tmp_path / "no-logp"), references, OPEConfig(), evaluate, ["wpdis"])
    with pytest.raises(UserError, match="held_out_fraction 0.9 leaves no episode of 2 to fit FQE on"):
        ope(bc, str(tmp_path / "no-logp"), references, OPEConfig(held_out_fraction=0.9), evaluate, ["fqe"])


def test_importance_weights_that_leave_too_few_effective_episodes_give_unreliable_not_a_number(project, estimated,
                                                                                               monkeypatch):
    monkeypatch.chdir(project)  # its MLflow store
    params = yaml.safe_load((project / "params.yaml").read_text())
    demanding = OPEConfig(**{**params["ope"], "min_effective_episodes": 21.0})  # more than the 20 episodes logged
    output = ope(project / "runs" / "bc", f"datasets/{DATASET}", project / "references", demanding,
                 EvaluateConfig(**params["evaluate"]))
    wpdis = output["estimates"]["wpdis"]
    assert wpdis["status"] == UNRELIABLE and "value" not in wpdis and wpdis["effective_episodes"] <= 20
    assert wpdis["undefined"].startswith("its importance weights collapsed: ")
    assert "fewer than ope.min_effective_episodes (21)" in wpdis["undefined"]
    assert "value" in output["estimates"]["dr"]  # doubly robust falls back on FQE's values
    run_id = json.loads((project / "runs" / "bc" / "run.json").read_text())["mlflow_run_id"]
    assert math.isnan(tracking(project).get_run(run_id).data.metrics["ope/wpdis"])


def test_a_softmax_version_of_the_policy_is_estimated_where_asked_and_orl_select_passes_it_over(project, estimated):
    """`orl ope --temperature`: a stochastic DQN (softmax over its Q-values) gives importance sampling weights on
    every logged action, where the greedy DQN's are 0 from its first disagreement; its estimates are tagged, and
    `orl select` ranks only estimates of the runs' own policies. Estimating the own policy again clears the tag."""
    client = tracking(project)
    run_id = json.loads((project / "runs" / "dqn" / "run.json").read_text())["mlflow_run_id"]
    result = orl("ope", "runs/dqn", "--dataset", f"datasets/{DATASET}", "--temperature", "2", cwd=project)
    assert result.returncode == 0, result.stderr[-3000:]
    softmax = json.loads((project / "runs" / "dqn" / "ope.json").read_text())
    assert softmax["policy"] == "softmax at temperature 2" and estimated["dqn"]["policy"] == "greedy"
    assert softmax["estimates"]["dr"]["effective_episodes"] > 0
    assert client.get_run(run_id).data.tags["ope.temperature"] == "2.0"
    selected = orl("select", "--dataset", DATASET, "--by", "fqe", cwd=project)
    assert f"] bc-{DATASET}: ope/fqe " in selected.stderr and f"] dqn-{DATASET}: " not in selected.stderr
    refused = orl("ope", "runs/dqn", "--dataset", f"datasets/{DATASET}", "--temperature", "0", cwd=project)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].endswith(
        "argument --temperature: '0' is not a positive number")

    again = orl("ope", "runs/dqn", "--dataset", f"datasets/{DATASET}", cwd=project)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "ope.temperature" not in client.get_run(run_id).data.tags
    assert json.loads((project / "runs" / "dqn" / "ope.json").read_text())["policy"] == "greedy"


def bc_policy_and_data(project: Path) -> tuple[ModulePolicy, dataset.DatasetCard, Episodes]:
    location = dataset.locate(str(project / "datasets" / DATASET))
    card = dataset.read_card(location)
    policy = ModulePolicy(load_rl_module(RunDir(project / "runs" / "bc").checkpoint), card.spaces[1], greedy=True)
    return policy, card, logged_episodes(location, card)


def test_the_model_based_estimator_alone_fits_no_fqe(project, capsys):
    policy, card, episodes = bc_policy_and_data(project)
    output = estimate_policy(policy, card, episodes, episodes, None, OPEConfig(**TINY_OPE), ["model"], label="model")
    assert set(output["estimates"]) == {"model"} and "value" in output["estimates"]["model"]
    assert "fqe_fit" not in output and "returns_allowed" not in output
    assert "fqe iteration" not in capsys.readouterr().err


def test_dynamics_fitted_once_serve_each_policy_as_its_own_fit_would(project, capsys):
    """benchmarks/ope_validation.py fits them once per dataset for every candidate."""
    policy, card, episodes = bc_policy_and_data(project)
    config = OPEConfig(**TINY_OPE)
    own = estimate_policy(policy, card, episodes, episodes, None, config, ["model"], label="model")
    dynamics = fit_dynamics(episodes, card.spaces[1].n, config, lambda *_: None)
    capsys.readouterr()
    shared = estimate_policy(policy, card, episodes, episodes, None, config, ["model"], label="model",
                             dynamics=dynamics)
    assert shared["estimates"]["model"] == own["estimates"]["model"]
    assert "model network" not in capsys.readouterr().err


def test_one_step_episodes_leave_the_model_based_estimator_undefined_and_fqe_a_number(project):
    """Every step ends its episode, as in a contextual bandit's data: there are no dynamics to learn. Here a state
    with the pole leaning right pays 1 whatever the action; FQE still gives a value within the logged returns."""
    policy, card, episodes = bc_policy_and_data(project)
    a = episodes.arrays
    rows = len(a[Col.EPS_ID])
    one_step = Episodes.of(a | {Col.EPS_ID: np.arange(rows), Col.T: np.zeros(rows, dtype=np.int64),
                                Col.REWARDS: (a[Col.OBS][:, 2] > 0).astype(np.float32),
                                Col.TERMINATEDS: np.ones(rows, dtype=bool), Col.TRUNCATEDS: np.zeros(rows, dtype=bool)})
    fitted = OPEConfig(**TINY_OPE | {"updates_per_iteration": 200})  # TINY_OPE's 50 updates fit no Q
    estimates = estimate_policy(policy, card, one_step, one_step, None, fitted, ["fqe", "model"],
                                label="bandit")["estimates"]
    assert estimates["model"] == {"undefined": f"every step of {DATASET} fitted on ends its episode (one-step "
                                  "episodes), leaving the model-based estimator no step that goes on to learn the "
                                  "dynamics from; use fqe"}
    assert 0 <= estimates["fqe"]["value"] <= 1


def test_a_fit_that_does_not_converge_gives_no_number_and_voids_the_runs_earlier_estimate(project, estimated,
                                                                                         monkeypatch):
    """Last in this module: it leaves NaN over the DQN run's earlier estimates, as it must."""
    monkeypatch.chdir(project)  # its MLflow store
    params = yaml.safe_load((project / "params.yaml").read_text())
    diverging = OPEConfig(**{**params["ope"], "lr": 1000.0})
    output = ope(project / "runs" / "dqn", f"datasets/{DATASET}", project / "references", diverging,
                 EvaluateConfig(**params["evaluate"]))
    assert not output["fqe_fit"]["converged"] and output["fqe_fit"]["td_loss"] > output["fqe_fit"]["td_loss_limit"]
    for name in ("fqe", "dr"):  # DR stands on FQE's values
        assert output["estimates"][name]["status"] == "did not converge"
        assert output["estimates"][name]["undefined"].startswith("FQE did not converge: its final TD loss ")
    assert output["estimates"]["wpdis"].get("status") != "did not converge"  # it stands on no fit
    run_id = json.loads((project / "runs" / "dqn" / "run.json").read_text())["mlflow_run_id"]
    metrics = tracking(project).get_run(run_id).data.metrics
    assert math.isnan(metrics["ope/fqe"]) and math.isnan(metrics["ope/dr"])
    result = orl("select", "--dataset", DATASET, "--by", "fqe", cwd=project)  # passes the voided run over
    assert f"] bc-{DATASET}: ope/fqe " in result.stderr and f"] dqn-{DATASET}: " not in result.stderr
