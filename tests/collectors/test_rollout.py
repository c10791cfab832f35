"""The stepping loop: per-episode seeds, whole episodes in order whatever the env count, and the Ray map that
gives evaluation its returns."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
import ray

from collectors.config import PolicyConfig
from collectors.rollout import EpisodeRunner, episode_seeds, rollout_returns
from common.envs import make_env
from dataset_format import Col, FrameColumn, column_to_numpy, episode_stats
from tests.conftest import CARTPOLE_EXPERT, CORRIDOR, PENDULUM_EXPERT, mixture

MIXTURE = mixture(CARTPOLE_EXPERT, 0.5)  # short, random CartPole episodes (about 10-60 steps)


def columns(table) -> dict[str, np.ndarray]:
    return {name: column_to_numpy(table[name]) for name in table.column_names}


def test_episode_seeds_are_deterministic():
    env_seed, rng = episode_seeds(7, 3)
    env_seed_again, rng_again = episode_seeds(7, 3)
    assert type(env_seed) is int and env_seed == env_seed_again
    np.testing.assert_array_equal(rng.random(5), rng_again.random(5))


def test_episode_seeds_differ_between_episodes_and_between_runs():
    env_seeds = [episode_seeds(7, i)[0] for i in range(50)] + [episode_seeds(8, i)[0] for i in range(50)]
    assert len(set(env_seeds)) == 100
    draws = [episode_seeds(7, i)[1].random() for i in range(50)]
    assert len(set(draws)) == 50


def test_run_returns_whole_episodes_in_ascending_eps_id_with_t_from_zero():
    runner = EpisodeRunner("CartPole-v1", MIXTURE, seed=11, num_envs=3)
    table = runner.run([4, 0, 3, 1, 2])  # handed out of order
    data = columns(table)
    eps_id, t = data[Col.EPS_ID], data[Col.T]

    assert table.schema == runner.schema and Col.ACTION_LOGP in table.column_names
    assert np.all(np.diff(eps_id) >= 0) and list(np.unique(eps_id)) == [0, 1, 2, 3, 4]
    ends = data[Col.TERMINATEDS] | data[Col.TRUNCATEDS]
    for episode in range(5):
        rows = eps_id == episode
        assert list(t[rows]) == list(range(rows.sum()))
        # Whole: the last step, and only it, ends the episode; each step starts where the one before ended.
        assert list(np.flatnonzero(ends[rows])) == [rows.sum() - 1]
        np.testing.assert_array_equal(data[Col.OBS][rows][1:], data[Col.NEW_OBS][rows][:-1])
    np.testing.assert_allclose(np.unique(np.exp(data[Col.ACTION_LOGP]).round(6)), [0.25, 0.75])


def test_images_are_recorded_once_per_distinct_frame_and_rebuilt_as_the_env_gave_them(user_code):
    # Two 8x8 frames an image: the agent's column, one of 7, and the goal's, the same in every image.
    pixels = dataclasses.replace(CORRIDOR, entry_point="corridor_sim.env:PixelCorridorEnv")
    table = EpisodeRunner(pixels, PolicyConfig(kind="random"), seed=3, num_envs=2).run([0, 1, 2])
    stored = {name: FrameColumn.of_arrow(table[name].combine_chunks()) for name in (Col.OBS, Col.NEW_OBS)}
    assert len(stored[Col.OBS].frames) <= 8 < table.num_rows
    assert len(np.unique(stored[Col.OBS].ids[:, 1])) == 1  # the goal's frame

    data = columns(table)
    env = make_env(pixels)
    for episode in range(3):
        rows = data[Col.EPS_ID] == episode
        first, _ = env.reset(seed=episode_seeds(3, episode)[0])
        np.testing.assert_array_equal(data[Col.OBS][rows][0], first.ravel())
        np.testing.assert_array_equal(data[Col.OBS][rows][1:], data[Col.NEW_OBS][rows][:-1])


def test_run_gives_the_same_table_whatever_num_envs():
    eps_ids = list(range(6))
    tables = [EpisodeRunner("CartPole-v1", MIXTURE, seed=11, num_envs=n).run(eps_ids) for n in (1, 2, 4, 8)]
    for table in tables[1:]:
        assert table.equals(tables[0])


def test_each_episode_depends_only_on_its_seed_and_index():
    """An episode run alone is the same as run among others; another seed gives other episodes."""
    together = EpisodeRunner("CartPole-v1", MIXTURE, seed=11, num_envs=2).run([0, 1, 2])
    alone = EpisodeRunner("CartPole-v1", MIXTURE, seed=11, num_envs=1).run([2])
    assert alone.equals(together.filter(pa.array(columns(together)[Col.EPS_ID] == 2)))
    other_seed = EpisodeRunner("CartPole-v1", MIXTURE, seed=12, num_envs=1).run([2])
    assert not other_seed.equals(alone)


def test_a_run_without_observations_is_the_same_run_less_those_columns():
    """What evaluation runs: returns need no frames."""
    whole = EpisodeRunner("CartPole-v1", MIXTURE, seed=11, num_envs=2).run([0, 1, 2])
    runner = EpisodeRunner("CartPole-v1", MIXTURE, seed=11, num_envs=2, observations=False)
    lean = runner.run([0, 1, 2])
    assert lean.schema == runner.schema and {Col.OBS, Col.NEW_OBS}.isdisjoint(lean.column_names)
    assert lean.equals(whole.drop_columns([Col.OBS, Col.NEW_OBS]))


def test_random_episodes_are_whole_episodes_of_the_uniform_policy():
    config = dataclasses.replace(CARTPOLE_EXPERT, random_episodes=0.5)
    data = columns(EpisodeRunner("CartPole-v1", config, seed=5, num_envs=3).run(list(range(12))))
    per_episode = {int(e): set(np.exp(data[Col.ACTION_LOGP][data[Col.EPS_ID] == e]).round(6))
                   for e in np.unique(data[Col.EPS_ID])}
    assert set(map(frozenset, per_episode.values())) == {frozenset({1.0}), frozenset({0.5})}, per_episode


def test_continuous_actions_without_a_density_have_no_logp_column():
    table = EpisodeRunner("Pendulum-v1", PENDULUM_EXPERT, seed=0, num_envs=2).run([0, 1])
    assert Col.ACTION_LOGP not in table.column_names
    assert table.num_rows == 400  # Pendulum truncates at 200 steps


@pytest.mark.parametrize("config", [MIXTURE, pytest.param(PolicyConfig(kind="random"), marks=pytest.mark.slow)])
def test_rollout_returns_one_return_per_episode_as_the_runner_gives(config, ray_local):
    returns, nodes = rollout_returns("CartPole-v1", config, seed=21, episodes=5, num_workers=2, label="test")
    local, _ = episode_stats(EpisodeRunner("CartPole-v1", config, seed=21, num_envs=1).run(list(range(5))))
    assert returns.shape == (5,)
    np.testing.assert_array_equal(returns, local)
    assert len(set(returns.tolist())) > 1  # distinct episodes, not one repeated
    assert nodes == {ray.get_runtime_context().get_node_id(): 5}


@pytest.mark.parametrize("config", [MIXTURE, pytest.param(PolicyConfig(kind="random"), marks=pytest.mark.slow)])
def test_rollout_returns_in_this_process_are_those_of_ray_actors(config, ray_local, capsys):
    """`evaluate.num_workers: 0`: the same episodes, stepped in the calling process, with progress lines."""
    in_process, nodes = rollout_returns("CartPole-v1", config, seed=21, episodes=9, num_workers=0, label="here")
    by_actors, _ = rollout_returns("CartPole-v1", config, seed=21, episodes=9, num_workers=2, label="actors")
    np.testing.assert_array_equal(in_process, by_actors)
    assert nodes == {}
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[here] ")]
    assert len(lines) == 3 and lines[-1].startswith(f"[here] 9/9 episodes, {int(in_process.sum())} steps")


@pytest.mark.slow  # three actor pools one after another
def test_rollouts_return_once_their_actors_cpus_are_free_again(ray_local):
    # Else the next actor pool, started at once, finds no CPU free and Ray Data warns that its job will hang.
    free = ray.available_resources()["CPU"]
    for seed in range(3):
        rollout_returns("CartPole-v1", CARTPOLE_EXPERT, seed, 4, 2, label="cpus")
        assert ray.available_resources().get("CPU", 0.0) == free
