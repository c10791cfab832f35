"""Gymnasium's other environments through `orl`, as a user names them in params.yaml: MountainCar, FrozenLake and
Taxi (Discrete observations, stored as integers) collect, train and evaluate; MuJoCo's HalfCheetah collects and
trains CQL and IQL. A Dict observation is refused in one line, and collects once flattened."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

import dataset_format as dataset
from dataset_format import Col
from tests.conftest import REPO, USER_CODE, assert_minari_round_trip, assert_user_error, orl

pytestmark = pytest.mark.slow  # a dozen `orl` commands, each starting Ray

SIGNPOST = {"entry_point": "corridor_sim.env:SignpostCorridorEnv", "max_episode_steps": 30}  # Dict observations
DATASETS = {
    "car": {"env": "MountainCar-v0", "episodes": 4, "seed": 0, "policy": {"kind": "random"}},
    "lake": {"env": {"id": "FrozenLake-v1", "kwargs": {"is_slippery": False}}, "episodes": 20, "seed": 0,
             "policy": {"kind": "random"}},
    "taxi": {"env": {"id": "Taxi-v3", "max_episode_steps": 50}, "episodes": 6, "seed": 0,
             "policy": {"kind": "random"}},
    "cheetah": {"env": {"id": "HalfCheetah-v5", "max_episode_steps": 50}, "episodes": 4, "seed": 0,
                "policy": {"kind": "random"}},
}
TINY = {"iterations": 2, "updates_per_iteration": 5, "batch_size": 32}
USER = {"PYTHONPATH": str(USER_CODE)}  # the signpost env's package, as the user's shell has it


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("envs")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"], params["policy_datasets"], params["train"]["runs"] = DATASETS, {}, {}
    params["collect"].update(num_collectors=2, envs_per_collector=2, episodes_per_task=2)
    for algo in ("bc", "cql", "iql"):
        params["algos"][algo].update(TINY)
    params["evaluate"].update(episodes=4)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root


@pytest.fixture(scope="module")
def collected(workdir) -> Path:
    for name in ("car", "lake", "taxi", "cheetah"):
        result = orl("collect", name, cwd=workdir, env=USER, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def test_each_env_is_collected_at_its_spaces(collected):
    expected = {"car": ({"type": "Box", "shape": [2]}, "Discrete"),
                "lake": ({"type": "Discrete", "n": 16}, "Discrete"),
                "taxi": ({"type": "Discrete", "n": 500}, "Discrete"),
                "cheetah": ({"type": "Box", "shape": [17]}, "Box")}
    for name, (observations, action_type) in expected.items():
        card = dataset.validate(collected / "datasets" / name)
        assert observations.items() <= card.observation_space.items() and card.action_space["type"] == action_type
        assert card.env_spec == (DATASETS[name]["env"] if isinstance(DATASETS[name]["env"], dict)
                                 else {"id": DATASETS[name]["env"]})
    lake = collected / "datasets" / "lake"
    assert str(pq.read_schema(next(lake.glob("*.parquet"))).field(Col.OBS).type) == "int64"  # the cell, as it is
    assert set(dataset.load_arrays(lake)[Col.OBS].tolist()) <= set(range(16))
    assert "mujoco" in dataset.read_card(collected / "datasets" / "cheetah").library_versions


@pytest.mark.parametrize("name", ["car", "lake", "taxi"])
def test_bc_trains_and_is_evaluated_in_raw_returns_without_a_ceiling(collected, name):
    """On Discrete observations the network takes them one-hot, in training and in the env alike."""
    run = f"runs/bc-{name}"
    result = orl("train", "--algo", "bc", "--dataset", f"datasets/{name}", "--out", run, cwd=collected, env=USER,
                 timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    if not (collected / "references").is_dir():
        result = orl("reference", "--out", "references", cwd=collected, env=USER, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
    result = orl("evaluate", run, "--references", "references", cwd=collected, env=USER, timeout=600)
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


def test_a_dict_observation_is_refused_in_one_line_and_collects_once_flattened(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"] = {
        "signpost": {"env": SIGNPOST, "episodes": 2, "seed": 0, "policy": {"kind": "random"}},
        "flat-signpost": {"env": {**SIGNPOST, "wrappers": ["FlattenObservation"]}, "episodes": 2, "seed": 0,
                          "policy": {"kind": "random"}}}
    params["policy_datasets"], params["train"]["runs"] = {}, {}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    for command in (["collect", "signpost"], ["reference", "--out", "references"]):
        assert_user_error(orl(*command, cwd=tmp_path, env=USER),
                          "env SignpostCorridorEnv: observation space Dict(", "wrappers: [FlattenObservation]")
    assert not (tmp_path / "datasets").exists() and not (tmp_path / "references").exists()
    result = orl("collect", "flat-signpost", cwd=tmp_path, env=USER, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # position (1) and the signpost one-hot (2)
    assert dataset.read_card(tmp_path / "datasets" / "flat-signpost").observation_space["shape"] == [3]


def test_discrete_observations_go_to_minari_and_come_back_with_the_same_rows(collected, tmp_path):
    assert_minari_round_trip(collected, "lake", DATASETS["lake"]["env"], tmp_path)
    assert dataset.read_card(tmp_path / "back").observation_space == {"type": "Discrete", "n": 16}
