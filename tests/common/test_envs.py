"""Environment specs: any Gymnasium id or a user's entry point, with kwargs, imports, wrappers and a time limit,
made by one function; bad specs are one-line errors."""

from __future__ import annotations

from importlib import metadata

import gymnasium as gym
import numpy as np
import pytest

from common.envs import EnvSpec, env_spaces, make_env, provider_versions, step_actions, time_limit
from common.errors import UserError
from tests.conftest import CORRIDOR

# id -> (observation shape, action space type, number of discrete actions or action dim)
GYMNASIUM_ENVS = {
    "CartPole-v1": ((4,), gym.spaces.Discrete, 2),
    "Acrobot-v1": ((6,), gym.spaces.Discrete, 3),
    "Pendulum-v1": ((3,), gym.spaces.Box, 1),
    "LunarLander-v3": ((8,), gym.spaces.Discrete, 4),
    "MountainCar-v0": ((2,), gym.spaces.Discrete, 3),
}


@pytest.mark.parametrize("env_id", GYMNASIUM_ENVS)
def test_any_registered_id_makes_its_env(env_id):
    shape, action_type, actions = GYMNASIUM_ENVS[env_id]
    observation_space, action_space = env_spaces(env_id)
    assert observation_space.shape == shape and isinstance(action_space, action_type)
    assert (action_space.n if action_type is gym.spaces.Discrete else action_space.shape[0]) == actions
    env = make_env(EnvSpec(id=env_id))
    try:
        assert env.spec.id == env_id and env.observation_space == observation_space
        assert observation_space.contains(env.reset(seed=0)[0])
    finally:
        env.close()


def test_a_spec_round_trips_through_the_cards_form_with_only_the_keys_given():
    spec = EnvSpec(id="Pendulum-v1", kwargs={"g": 9.81}, imports=["gymnasium.envs.classic_control"],
                   wrappers=[{"RescaleAction": {"min_action": -1.0, "max_action": 1.0}}], max_episode_steps=50)
    data = spec.to_dict()
    assert data == {"id": "Pendulum-v1", "kwargs": {"g": 9.81}, "import": ["gymnasium.envs.classic_control"],
                    "wrappers": [{"RescaleAction": {"min_action": -1.0, "max_action": 1.0}}], "max_episode_steps": 50}
    assert EnvSpec.from_dict(data) == spec
    assert EnvSpec.of("CartPole-v1").to_dict() == {"id": "CartPole-v1"} and EnvSpec.of("CartPole-v1").is_plain_id
    assert not spec.is_plain_id and spec.label == "Pendulum-v1"


def test_records_without_a_spec_name_a_registered_id():
    assert EnvSpec.recorded("CartPole-v1", None) == EnvSpec(id="CartPole-v1")
    assert EnvSpec.recorded("Corridor", CORRIDOR.to_dict()) == CORRIDOR
    assert EnvSpec.recorded(None, None) is None


def test_kwargs_wrappers_and_the_time_limit_apply_in_order():
    spec = EnvSpec(id="Pendulum-v1", kwargs={"g": 3.0}, max_episode_steps=7,
                   wrappers=[{"RescaleAction": {"min_action": -1.0, "max_action": 1.0}}, "FlattenObservation"])
    env = make_env(spec)
    try:
        assert env.unwrapped.g == 3.0
        np.testing.assert_array_equal(env.action_space.low, [-1.0])
        env.reset(seed=0)
        steps = 0
        while True:
            steps += 1
            *_, terminated, truncated, _ = env.step(np.array([0.5], dtype=np.float32))
            if terminated or truncated:
                break
        assert steps == 7 and truncated
    finally:
        env.close()
    assert time_limit(spec) == 7 and time_limit(EnvSpec(id="CartPole-v1")) == 500


def test_a_users_env_class_is_made_by_entry_point_with_its_kwargs_and_name(user_code):
    env = make_env(CORRIDOR)
    try:
        assert env.unwrapped.length == 6 and env.spec.max_episode_steps == 30
        assert env.observation_space.shape == (2,) and env.action_space == gym.spaces.Discrete(3)
    finally:
        env.close()
    assert CORRIDOR.label == "Corridor" and time_limit(CORRIDOR) == 30
    assert EnvSpec(entry_point="corridor_sim.env:CorridorEnv").label == "CorridorEnv"


def test_provider_versions_name_the_distributions_whose_code_the_env_runs():
    cartpole, lander = make_env("CartPole-v1"), make_env("LunarLander-v3")
    try:
        assert provider_versions(cartpole) == {"gymnasium": metadata.version("gymnasium")}
        assert provider_versions(lander) == {"Box2D": metadata.version("Box2D"),
                                             "gymnasium": metadata.version("gymnasium")}
    finally:
        cartpole.close()
        lander.close()


@pytest.mark.parametrize("spec,message", [
    (EnvSpec(id="CartPol-v1"), r"unknown env id 'CartPol-v1': did you mean CartPole-v1"),
    # An id that no module registers: ALE's would be known once any test of the process has imported ale_py.
    (EnvSpec(id="Lab/Corridor-v0"), r"unknown env id 'Lab/Corridor-v0': is it registered by a module to `import` "
                                    r"first\? .*\{id: ALE/Pong-v5, import: \[ale_py\]\}"),
    (EnvSpec(id="CartPole-v1", imports=["no_such_simulator"]),
     r"env CartPole-v1: import 'no_such_simulator' cannot be imported \(No module named 'no_such_simulator'\); "
     r"install its package or put it on PYTHONPATH"),
    (EnvSpec(entry_point="no_such_package.envs:World"),
     r"env World: entry_point 'no_such_package.envs:World' cannot be imported"),
    (EnvSpec(id="CartPole-v1", kwargs={"gravity": 3}),
     r"env CartPole-v1 cannot be made with kwargs \{'gravity': 3\} \(.*unexpected keyword argument 'gravity'.*\); "
     r"fix its `kwargs`"),
    (EnvSpec(id="CartPole-v1", wrappers=["FrameStack"]),
     r"env CartPole-v1: unknown wrapper 'FrameStack': did you mean FrameStackObservation"),
    (EnvSpec(id="CartPole-v1", wrappers=[{"RescaleAction": {"min_action": -1}}]),
     r"env CartPole-v1: wrapper RescaleAction with kwargs \{'min_action': -1\} fails"),
])
def test_a_bad_spec_is_one_line_naming_it_and_what_to_do(spec, message):
    with pytest.raises(UserError, match=message) as err:
        make_env(spec)
    assert "\n" not in str(err.value)


def test_a_users_entry_point_with_kwargs_its_class_rejects_is_named(user_code):
    with pytest.raises(UserError, match=r"env Corridor cannot be made with kwargs \{'length': 1\} "
                                        r"\(length 1 is too short\)"):
        make_env(EnvSpec(entry_point=CORRIDOR.entry_point, kwargs={"length": 1}, name="Corridor"))


@pytest.mark.parametrize("data,message", [
    ({}, "either `id`"), ({"id": "CartPole-v1", "entry_point": "a.b:C"}, "not both"),
    ({"entry_point": "a.b.C"}, "must read package.module:Name"),
    ({"id": "CartPole-v1", "wrappers": [{"A": {}, "B": {}}]}, "one-key mapping"),
    ({"id": "CartPole-v1", "max_episode_steps": 0}, "must be positive"),
])
def test_a_malformed_spec_is_refused_when_parsed(data, message):
    with pytest.raises(ValueError, match=message):
        EnvSpec.from_dict(data)


def test_step_actions_are_python_ints_for_discrete_and_the_array_itself_for_box():
    discrete = step_actions(np.array([1, 0, 1], dtype=np.int64), gym.spaces.Discrete(2))
    assert discrete == [1, 0, 1]
    assert all(type(a) is int for a in discrete)

    box_actions = np.array([[0.5], [-1.5]], dtype=np.float32)
    assert step_actions(box_actions, gym.spaces.Box(-2.0, 2.0, (1,), np.float32)) is box_actions
