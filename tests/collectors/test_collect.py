"""Collection with real Ray actors: determinism, behaviour policies, every supported environment."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

import dataset_format as dataset
from collectors.collect import collect
from collectors.config import CollectConfig, DatasetConfig, PolicyConfig
from common.envs import EXPERTS
from common.errors import UserError
from dataset_format import Col
from tests.conftest import TINY_COLLECT


def file_hashes(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_same_params_give_byte_identical_files_whatever_the_actor_count(expert_dataset, tmp_path):
    spec = DatasetConfig(env="CartPole-v1", episodes=20, seed=3)
    settings = dataclasses.replace(TINY_COLLECT, num_collectors=1, envs_per_collector=3)
    again = collect("cartpole-expert", spec, settings, tmp_path / "again")
    assert again.files == dataset.read_card(expert_dataset).files
    assert file_hashes(tmp_path / "again") == file_hashes(expert_dataset)


def test_mixture_logs_the_behaviour_log_probability(mixture_dataset):
    arrays = dataset.load_arrays(mixture_dataset)
    prob = np.exp(arrays[Col.ACTION_LOGP])
    # epsilon 0.5 over 2 actions: the expert's action has p = 0.75, the other p = 0.25; both occur.
    np.testing.assert_allclose(np.unique(prob.round(6)), [0.25, 0.75])
    card = dataset.read_card(mixture_dataset)
    assert card.behavior_policy == {"kind": "mixture", "epsilon": 0.5, "model": "", "greedy": False,
                                    "action_noise": 0.0, "random_episodes": 0.0}


def test_mixed_data_runs_whole_episodes_by_one_policy_or_the_other(ray_local, tmp_path):
    spec = DatasetConfig(env="CartPole-v1", episodes=16, seed=5, policy=PolicyConfig(kind="expert", random_episodes=0.5))
    collect("mixed", spec, CollectConfig(num_collectors=2, envs_per_collector=4, episodes_per_task=8), tmp_path / "a")
    arrays = dataset.load_arrays(tmp_path / "a")
    # The expert's actions have probability 1, the random policy's 1/2: one value per episode.
    per_episode = {int(e): set(np.exp(arrays[Col.ACTION_LOGP][arrays[Col.EPS_ID] == e]).round(6))
                   for e in np.unique(arrays[Col.EPS_ID])}
    assert set(map(frozenset, per_episode.values())) == {frozenset({1.0}), frozenset({0.5})}, per_episode
    # Which episodes are random depends on the seed only, not on how episodes share actors and envs.
    collect("mixed", spec, CollectConfig(num_collectors=1, envs_per_collector=3, episodes_per_task=8), tmp_path / "b")
    assert file_hashes(tmp_path / "a") == file_hashes(tmp_path / "b")


def test_action_noise_perturbs_the_continuous_expert_by_its_std_and_is_seeded(ray_local, tmp_path):
    spec = DatasetConfig(env="Pendulum-v1", episodes=8, seed=4, policy=PolicyConfig(kind="expert", action_noise=0.1))
    collect("noisy", spec, CollectConfig(num_collectors=2, envs_per_collector=2, episodes_per_task=2), tmp_path / "a")
    arrays = dataset.load_arrays(tmp_path / "a")
    expert = np.array([EXPERTS["Pendulum-v1"](obs, None) for obs in arrays[Col.OBS]])
    actions = arrays[Col.ACTIONS]
    assert actions.min() >= -2.0 and actions.max() <= 2.0
    # Where neither the expert nor the noisy action sits at a bound, the difference is the noise: std 0.1 x 2.
    inside = (np.abs(expert) < 2.0) & (np.abs(actions) < 2.0)
    assert inside.sum() > 300
    assert np.std(actions[inside] - expert[inside]) == pytest.approx(0.2, rel=0.2)
    collect("noisy", spec, CollectConfig(num_collectors=1, envs_per_collector=3, episodes_per_task=3), tmp_path / "b")
    assert file_hashes(tmp_path / "a") == file_hashes(tmp_path / "b")


def test_action_noise_on_discrete_actions_says_to_use_a_mixture(ray_local, tmp_path):
    spec = DatasetConfig(env="CartPole-v1", episodes=2, seed=0, policy=PolicyConfig(kind="expert", action_noise=0.1))
    with pytest.raises(UserError, match="action_noise applies to continuous actions; CartPole-v1's are discrete"):
        collect("noisy", spec, TINY_COLLECT, tmp_path / "c")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("env_id,obs_dim,logp", [
    ("Acrobot-v1", 6, True), ("Pendulum-v1", 3, False), ("LunarLander-v3", 8, True)])
def test_every_env_collects_and_the_expert_beats_random(env_id, obs_dim, logp, ray_local, tmp_path):
    settings = CollectConfig(num_collectors=2, envs_per_collector=2, episodes_per_task=2)
    cards = {kind: collect(kind, DatasetConfig(env=env_id, episodes=4, seed=0, policy=PolicyConfig(kind=kind)),
                           settings, tmp_path / kind) for kind in ("random", "expert")}
    assert cards["expert"].returns["mean"] > cards["random"].returns["mean"]
    arrays = dataset.load_arrays(tmp_path / "expert")
    assert arrays[Col.OBS].shape[1] == obs_dim
    assert (Col.ACTION_LOGP in arrays) == logp
    assert Col.ACTION_LOGP in dataset.load_arrays(tmp_path / "random")  # uniform density is always known


def test_refuses_to_overwrite_an_existing_dataset(expert_dataset):
    before = file_hashes(expert_dataset)
    with pytest.raises(UserError, match="already exists"):
        collect("x", DatasetConfig(env="CartPole-v1", episodes=1, seed=0), CollectConfig(), expert_dataset)
    assert file_hashes(expert_dataset) == before


def test_tasks_are_combined_in_order_into_files_of_file_mib(expert_dataset, tmp_path):
    spec = DatasetConfig(env="CartPole-v1", episodes=20, seed=3)
    # A task here is 5 episodes, 2,500 rows, about 0.15 MiB in memory: 0.2 MiB takes two tasks per file.
    card = collect("cartpole-expert", spec, dataclasses.replace(TINY_COLLECT, file_mib=0.2), tmp_path / "two")
    assert [f["rows"] for f in card.files] == [5000, 5000]
    assert len(dataset.read_card(expert_dataset).files) == 4
    assert dataset.load_table(tmp_path / "two").equals(dataset.load_table(expert_dataset))
