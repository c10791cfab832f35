"""The supported environments: the id check, their spaces, step actions, and the hand-written experts."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from common.envs import EXPERTS, check_env_id, env_spaces, make_env, step_actions
from common.errors import UserError

# id -> (observation dim, action space type, number of discrete actions or action dim)
SUPPORTED = {
    "CartPole-v1": (4, gym.spaces.Discrete, 2),
    "Acrobot-v1": (6, gym.spaces.Discrete, 3),
    "Pendulum-v1": (3, gym.spaces.Box, 1),
    "LunarLander-v3": (8, gym.spaces.Discrete, 4),
}


def test_the_supported_envs_are_those_with_an_expert():
    assert set(EXPERTS) == set(SUPPORTED)


@pytest.mark.parametrize("call", [check_env_id, make_env, env_spaces])
def test_an_unknown_env_id_is_refused_naming_it_and_the_supported_ones(call):
    with pytest.raises(UserError) as err:
        call("MountainCar-v0")
    message = str(err.value)
    assert "unknown env id 'MountainCar-v0'" in message
    for env_id in SUPPORTED:
        assert env_id in message
    assert "\n" not in message


def test_supported_ids_pass_the_check():
    for env_id in SUPPORTED:
        assert check_env_id(env_id) is None  # raises nothing


@pytest.mark.parametrize("env_id", SUPPORTED)
def test_make_env_and_env_spaces_give_the_envs_spaces(env_id):
    obs_dim, action_type, actions = SUPPORTED[env_id]
    observation_space, action_space = env_spaces(env_id)
    assert observation_space.shape == (obs_dim,)
    assert isinstance(action_space, action_type)
    if action_type is gym.spaces.Discrete:
        assert action_space.n == actions
    else:
        assert action_space.shape == (actions,)

    env = make_env(env_id)
    try:
        assert env.spec.id == env_id
        assert env.observation_space == observation_space and env.action_space == action_space
        obs, _ = env.reset(seed=0)
        assert observation_space.contains(obs)
    finally:
        env.close()


def test_step_actions_are_python_ints_for_discrete_and_the_array_itself_for_box():
    discrete = step_actions(np.array([1, 0, 1], dtype=np.int64), gym.spaces.Discrete(2))
    assert discrete == [1, 0, 1]
    assert all(type(a) is int for a in discrete)

    box_actions = np.array([[0.5], [-1.5]], dtype=np.float32)
    assert step_actions(box_actions, gym.spaces.Box(-2.0, 2.0, (1,), np.float32)) is box_actions


def test_step_actions_are_python_ints_for_discrete_spaces_and_step_the_env():
    env = make_env("CartPole-v1")
    try:
        env.reset(seed=0)
        [action] = step_actions(np.array([1]), env.action_space)
        assert type(action) is int and env.action_space.contains(action)
        _, reward, *_ = env.step(action)
        assert reward == 1.0
    finally:
        env.close()
    box = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    actions = np.array([[0.5]], dtype=np.float32)
    assert step_actions(actions, box) is actions  # continuous actions pass as they are


def visited_observations(env_id: str, episodes: int = 2, steps: int = 60) -> list[np.ndarray]:
    """Observations of the expert's own episodes, as collection sees them."""
    env = make_env(env_id)
    seen = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=episode)
            for _ in range(steps):
                seen.append(obs)
                obs, _, terminated, truncated, _ = env.step(step_actions(
                    np.array([EXPERTS[env_id](obs, env)]), env.action_space)[0])
                if terminated or truncated:
                    break
    finally:
        env.close()
    return seen


@pytest.mark.parametrize("env_id", SUPPORTED)
def test_each_expert_is_a_deterministic_function_of_the_observation(env_id):
    """The same observation gives the same valid action, again and in another env instance in another state."""
    observations = visited_observations(env_id)
    other = make_env(env_id)
    try:
        other.reset(seed=123)  # a different state: the expert must not read it
        first = [EXPERTS[env_id](obs, other) for obs in observations]
        for _ in range(3):  # advance the other env: still the same actions
            other.step(other.action_space.sample())
        again = [EXPERTS[env_id](obs.copy(), other) for obs in observations]
    finally:
        other.close()
    action_space = env_spaces(env_id)[1]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
        assert action_space.contains(b if isinstance(action_space, gym.spaces.Box) else int(b))
    # Not a constant either: the experts react to the observation.
    assert len({np.asarray(a).tobytes() for a in first}) > 1
