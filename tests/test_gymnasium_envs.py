"""Gymnasium's other environments through `orl`, as a user names them in params.yaml: MountainCar, FrozenLake and
Taxi (Discrete observations, one-hot through FlattenObservation) collect, train and evaluate; MuJoCo's HalfCheetah
collects and trains CQL and IQL. Spaces a dataset cannot hold are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import dataset_format as dataset
from dataset_format import Col
from tests.conftest import REPO, assert_user_error, orl

pytestmark = pytest.mark.slow  # a dozen `orl` commands, each starting Ray

ONE_HOT = ["FlattenObservation"]  # Discrete observations become one-hot Boxes
DATASETS = {
    "car": {"env": "MountainCar-v0", "episodes": 4, "seed": 0, "policy": {"kind": "random"}},
    "lake": {"env": {"id": "FrozenLake-v1", "kwargs": {"is_slippery": False}, "wrappers": ONE_HOT},
             "episodes": 20, "seed": 0, "policy": {"kind": "random"}},
    "taxi": {"env": {"id": "Taxi-v3", "wrappers": ONE_HOT, "max_episode_steps": 50}, "episodes": 6, "seed": 0,
             "policy": {"kind": "random"}},
    "cheetah": {"env": {"id": "HalfCheetah-v5", "max_episode_steps": 50}, "episodes": 4, "seed": 0,
                "policy": {"kind": "random"}},
    "bare-lake": {"env": "FrozenLake-v1", "episodes": 2, "seed": 0, "policy": {"kind": "random"}},
}
TINY = {"iterations": 2, "updates_per_iteration": 5, "batch_size": 32}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("envs")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"], params["policy_datasets"], params["train"]["datasets"] = DATASETS, {}, []
    params["collect"].update(num_collectors=2, envs_per_collector=2, episodes_per_task=2)
    for algo in ("bc", "cql", "iql"):
        params["algos"][algo].update(TINY)
    params["evaluate"].update(episodes=4)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root


@pytest.fixture(scope="module")
def collected(workdir) -> Path:
    for name in ("car", "lake", "taxi", "cheetah"):
        result = orl("collect", name, cwd=workdir, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def test_each_env_is_collected_at_its_spaces(collected):
    expected = {"car": ((2,), "Discrete"), "lake": ((16,), "Discrete"), "taxi": ((500,), "Discrete"),
                "cheetah": ((17,), "Box")}
    for name, (shape, action_type) in expected.items():
        card = dataset.validate(collected / "datasets" / name)
        assert tuple(card.observation_space["shape"]) == shape and card.action_space["type"] == action_type
        assert card.env_spec == (DATASETS[name]["env"] if isinstance(DATASETS[name]["env"], dict)
                                 else {"id": DATASETS[name]["env"]})
    lake = dataset.load_arrays(collected / "datasets" / "lake")[Col.OBS]
    assert set(lake.sum(axis=1).tolist()) == {1.0}  # one-hot
    assert "mujoco" in dataset.read_card(collected / "datasets" / "cheetah").library_versions


@pytest.mark.parametrize("name", ["car", "lake", "taxi"])
def test_bc_trains_and_is_evaluated_in_raw_returns_without_a_ceiling(collected, name):
    run = f"runs/bc-{name}"
    result = orl("train", "--algo", "bc", "--dataset", f"datasets/{name}", "--out", run, cwd=collected, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    if not (collected / "references").is_dir():
        result = orl("reference", "--out", "references", cwd=collected, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
    result = orl("evaluate", run, "--references", "references", cwd=collected, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((collected / run / "eval.json").read_text())
    assert metrics["episodes"] == 4 and "normalized_score" not in metrics
    assert "has no ceiling reference" in metrics["no_normalized_score"]


@pytest.mark.parametrize("algo", ["cql", "iql"])
def test_continuous_control_learners_train_on_mujoco(collected, algo):
    result = orl("train", "--algo", algo, "--dataset", "datasets/cheetah", "--out", f"runs/{algo}-cheetah",
                 cwd=collected, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (collected / "runs" / f"{algo}-cheetah" / "checkpoint").is_dir()


def test_discrete_observations_without_the_flattening_are_refused_in_one_line(workdir):
    assert_user_error(orl("collect", "bare-lake", cwd=workdir), "env FrozenLake-v1: observation space Discrete(16) "
                      "cannot be stored", "wrappers: [FlattenObservation]")
    assert not (workdir / "datasets" / "bare-lake").exists()
