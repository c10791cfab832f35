"""Minari datasets made by Minari's own DataCollector come in, train, and ours go out to `minari.load_dataset`."""

from __future__ import annotations

import json

import gymnasium as gym
import minari
import numpy as np
import pytest
import yaml

import dataset_format as dataset
from common.errors import UserError
from interop.config import ImportConfig
from interop.importing import import_dataset
from tests.conftest import assert_user_error, orl

MINARI_ID = "orl-tests/cartpole/random-v0"


@pytest.fixture(scope="module")
def minari_store(tmp_path_factory):
    """A local Minari store holding 12 random CartPole episodes recorded by minari.DataCollector."""
    root = tmp_path_factory.mktemp("minari")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        env = minari.DataCollector(gym.make("CartPole-v1"))
        env.action_space.seed(0)
        for episode in range(12):
            env.reset(seed=episode)
            while not any(env.step(env.action_space.sample())[2:4]):
                pass
        env.create_dataset(MINARI_ID, algorithm_name="uniform random", author="tests", author_email="-",
                           code_permalink="-", description="random CartPole episodes")
        env.close()
        yield root


@pytest.fixture
def in_store(minari_store, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(minari_store))
    return minari_store


@pytest.mark.slow  # imports, then trains
def test_a_minari_dataset_becomes_ours_and_trains_bc(in_store, tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "datasets": {},
        "imports": {"cartpole-minari": {"format": "minari", "source": MINARI_ID, "env": "CartPole-v1"}},
        "algos": {"bc": {"iterations": 2, "updates_per_iteration": 5, "batch_size": 64, "hidden_layers": [16]}},
    }))
    result = orl("datasets", "import", "cartpole-minari", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]

    source = minari.load_dataset(MINARI_ID)
    card = dataset.validate(tmp_path / "datasets" / "cartpole-minari")
    assert (card.env_id, card.episodes, card.transitions) == ("CartPole-v1", source.total_episodes,
                                                               source.total_steps)
    assert card.source["minari"]["dataset_id"] == MINARI_ID and card.source["minari"]["author"] == ["tests"]
    assert card.behavior_policy["description"] == "uniform random"
    arrays = dataset.load_arrays(tmp_path / "datasets" / "cartpole-minari")
    returns, _ = dataset.episode_stats(dataset.load_table(tmp_path / "datasets" / "cartpole-minari"))
    for episode in source.iterate_episodes():
        rows = arrays[dataset.Col.EPS_ID] == episode.id
        np.testing.assert_array_equal(arrays[dataset.Col.OBS][rows], episode.observations[:-1].astype(np.float32))
        np.testing.assert_array_equal(arrays[dataset.Col.NEW_OBS][rows], episode.observations[1:].astype(np.float32))
        np.testing.assert_array_equal(arrays[dataset.Col.ACTIONS][rows], episode.actions)
        np.testing.assert_array_equal(arrays[dataset.Col.TERMINATEDS][rows], episode.terminations)
        assert returns[episode.id] == pytest.approx(episode.rewards.sum())

    # Re-importing gives the same bytes.
    assert orl("datasets", "import", "cartpole-minari", "--out", "again", cwd=tmp_path).returncode == 0
    for name in ("_card.json", *(f["path"] for f in card.files)):
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "datasets" / "cartpole-minari" / name).read_bytes()

    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    result = orl("train", "--algo", "bc", "--dataset", "datasets/cartpole-minari", cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((tmp_path / "runs" / "bc-cartpole-minari" / "run.json").read_text())
    assert info["env_id"] == "CartPole-v1" and info["registered_model"]["name"] == "CartPole-v1-bc"


def test_our_dataset_exports_to_minari_and_loads_back(in_store, expert_dataset, tmp_path):
    result = orl("datasets", "export", str(expert_dataset), "--to", "minari", "--id", "orl/cartpole-expert-v0",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    exported = minari.load_dataset("orl/cartpole-expert-v0")
    card = dataset.read_card(expert_dataset)
    assert (exported.total_episodes, exported.total_steps) == (card.episodes, card.transitions)
    arrays = dataset.load_arrays(expert_dataset)
    returns, _ = dataset.episode_stats(dataset.load_table(expert_dataset))
    for index, episode in enumerate(exported.iterate_episodes()):
        rows = arrays[dataset.Col.EPS_ID] == np.unique(arrays[dataset.Col.EPS_ID])[index]
        np.testing.assert_array_equal(episode.observations[:-1], arrays[dataset.Col.OBS][rows])
        np.testing.assert_array_equal(episode.observations[-1], arrays[dataset.Col.NEW_OBS][rows][-1])
        np.testing.assert_array_equal(episode.actions, arrays[dataset.Col.ACTIONS][rows])
        assert episode.rewards.sum() == pytest.approx(returns[index])
    assert exported.recover_environment().spec.id == "CartPole-v1"

    # An existing id is never overwritten.
    again = orl("datasets", "export", str(expert_dataset), "--to", "minari", "--id", "orl/cartpole-expert-v0",
                cwd=tmp_path)
    assert_user_error(again, "orl/cartpole-expert-v0 already exists")


def test_spaces_we_cannot_represent_are_refused_by_name(in_store, tmp_path):
    from minari.data_collector import EpisodeBuffer

    observation_space = gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (2,)), "goal": gym.spaces.Discrete(3)})
    steps = 3
    observations = {"position": np.zeros((steps + 1, 2), dtype=np.float32), "goal": np.zeros(steps + 1, dtype=np.int64)}
    minari.create_dataset_from_buffers(
        "orl-tests/dict-obs-v0",
        [EpisodeBuffer(id=0, observations=observations, actions=np.zeros(steps, dtype=np.int64),
                       rewards=[0.0] * steps, terminations=[False, False, True], truncations=[False] * steps)],
        observation_space=observation_space, action_space=gym.spaces.Discrete(2), algorithm_name="-", author="-",
        author_email="-", code_permalink="-", description="-")
    config = ImportConfig(format="minari", source="orl-tests/dict-obs-v0")
    with pytest.raises(UserError, match="the Minari dataset's observation space Dict.* cannot be represented"):
        import_dataset("dict", config, tmp_path / "dict", file_bytes=2**20)
    assert not (tmp_path / "dict").exists()
    with pytest.raises(UserError, match="no Minari dataset at orl-tests/absent-v0"):
        import_dataset("absent", ImportConfig(format="minari", source="orl-tests/absent-v0"), tmp_path / "absent",
                       file_bytes=2**20)
