"""Collection with real Ray actors: determinism, behaviour policies, every supported environment."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest
import ray

import dataset_format as dataset
from collectors.collect import collect
from collectors.config import CollectConfig, DatasetConfig, PolicyConfig
from common.errors import UserError
from dataset_format import Col
from examples.controllers import pendulum
from tests.conftest import CARTPOLE_EXPERT, PENDULUM_EXPERT, TINY_COLLECT


def file_hashes(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_same_params_give_byte_identical_files_whatever_the_actor_count(expert_dataset, tmp_path):
    spec = DatasetConfig(env="CartPole-v1", episodes=20, seed=3, policy=CARTPOLE_EXPERT)
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
    assert card.behavior_policy["kind"] == "mixture" and card.behavior_policy["epsilon"] == 0.5
    assert card.behavior_policy["base"]["callable"] == "examples.controllers:cartpole"


@pytest.mark.slow  # a collection of its own, as are the next ones: seconds each, mostly Ray Data's start
def test_mixed_data_runs_whole_episodes_by_one_policy_or_the_other(ray_local, tmp_path):
    spec = DatasetConfig(env="CartPole-v1", episodes=16, seed=5, policy=dataclasses.replace(CARTPOLE_EXPERT, random_episodes=0.5))
    collect("mixed", spec, CollectConfig(num_collectors=2, envs_per_collector=4, episodes_per_task=8), tmp_path / "a")
    arrays = dataset.load_arrays(tmp_path / "a")
    # The expert's actions have probability 1, the random policy's 1/2: one value per episode.
    per_episode = {int(e): set(np.exp(arrays[Col.ACTION_LOGP][arrays[Col.EPS_ID] == e]).round(6))
                   for e in np.unique(arrays[Col.EPS_ID])}
    assert set(map(frozenset, per_episode.values())) == {frozenset({1.0}), frozenset({0.5})}, per_episode
    # Which episodes are random depends on the seed only, not on how episodes share actors and envs.
    collect("mixed", spec, CollectConfig(num_collectors=1, envs_per_collector=3, episodes_per_task=8), tmp_path / "b")
    assert file_hashes(tmp_path / "a") == file_hashes(tmp_path / "b")


@pytest.mark.slow
def test_action_noise_perturbs_the_continuous_expert_by_its_std_and_is_seeded(ray_local, tmp_path):
    spec = DatasetConfig(env="Pendulum-v1", episodes=8, seed=4, policy=dataclasses.replace(PENDULUM_EXPERT, action_noise=0.1))
    collect("noisy", spec, CollectConfig(num_collectors=2, envs_per_collector=2, episodes_per_task=2), tmp_path / "a")
    arrays = dataset.load_arrays(tmp_path / "a")
    expert = pendulum(arrays[Col.OBS])
    actions = arrays[Col.ACTIONS]
    assert actions.min() >= -2.0 and actions.max() <= 2.0
    # Where neither the expert nor the noisy action sits at a bound, the difference is the noise: std 0.1 x 2.
    inside = (np.abs(expert) < 2.0) & (np.abs(actions) < 2.0)
    assert inside.sum() > 300
    assert np.std(actions[inside] - expert[inside]) == pytest.approx(0.2, rel=0.2)
    collect("noisy", spec, CollectConfig(num_collectors=1, envs_per_collector=3, episodes_per_task=3), tmp_path / "b")
    assert file_hashes(tmp_path / "a") == file_hashes(tmp_path / "b")


def test_action_noise_on_discrete_actions_says_to_use_a_mixture(ray_local, tmp_path):
    spec = DatasetConfig(env="CartPole-v1", episodes=2, seed=0,
                         policy=dataclasses.replace(CARTPOLE_EXPERT, action_noise=0.1))
    with pytest.raises(UserError, match="action_noise applies to continuous actions; examples.controllers:cartpole's "
                                        "are discrete"):
        collect("noisy", spec, TINY_COLLECT, tmp_path / "c")
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
@pytest.mark.parametrize("env_id,controller,obs_dim,logp", [
    ("Acrobot-v1", "acrobot", 6, True), ("Pendulum-v1", "pendulum", 3, False),
    ("LunarLander-v3", "lunar_lander", 8, True)])
def test_every_env_collects_and_the_expert_beats_random(env_id, controller, obs_dim, logp, ray_local, tmp_path):
    settings = CollectConfig(num_collectors=2, envs_per_collector=2, episodes_per_task=2)
    policies = {"random": PolicyConfig(kind="random"),
                "expert": PolicyConfig(kind="callable", callable=f"examples.controllers:{controller}")}
    cards = {kind: collect(kind, DatasetConfig(env=env_id, episodes=4, seed=0, policy=policy), settings, tmp_path / kind)
             for kind, policy in policies.items()}
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
    spec = DatasetConfig(env="CartPole-v1", episodes=20, seed=3, policy=CARTPOLE_EXPERT)
    # A task here is 5 episodes, 2,500 rows, about 0.15 MiB in memory: 0.2 MiB takes two tasks per file.
    card = collect("cartpole-expert", spec, dataclasses.replace(TINY_COLLECT, file_mib=0.2), tmp_path / "two")
    assert [f["rows"] for f in card.files] == [5000, 5000]
    assert len(dataset.read_card(expert_dataset).files) == 4
    assert dataset.load_table(tmp_path / "two").equals(dataset.load_table(expert_dataset))


def test_a_task_larger_than_ray_datas_blocks_is_written_as_whole_episodes(ray_local, tmp_path, monkeypatch):
    # Blocks of 64 KiB stand in for 128 MiB: a task of 5 expert episodes (about 0.15 MiB) is larger than it, as a
    # task of a few Atari episodes is larger than 128 MiB.
    monkeypatch.setattr(ray.data.DataContext.get_current(), "target_max_block_size", 64 * 2**10)
    spec = DatasetConfig(env="CartPole-v1", episodes=10, seed=3, policy=CARTPOLE_EXPERT)
    card = collect("cartpole-expert", spec, dataclasses.replace(TINY_COLLECT, file_mib=0.05), tmp_path / "d")
    assert [f["rows"] for f in card.files] == [2500, 2500]  # a task per file, not a slice of one
    dataset.validate(tmp_path / "d")  # each file ends its last episode
    assert ray.data.DataContext.get_current().target_max_block_size == 64 * 2**10  # as it was
