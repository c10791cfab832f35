"""Behaviour policies: their actions and the log-probabilities they report, seeded per row."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

from collectors.config import PolicyConfig
from collectors.policies import CallablePolicy, MixturePolicy, RandomPolicy, build_policy, worker_env_vars
from common.envs import env_spaces, make_env
from common.errors import UserError
from common.trained_policy import ModulePolicy
from examples.controllers import acrobot, cartpole, pendulum
from tests.conftest import ACROBOT_EXPERT, CARTPOLE_EXPERT, CORRIDOR, PENDULUM_EXPERT, mixture

DISCRETE = gym.spaces.Discrete(3)
BOX = gym.spaces.Box(np.array([0.0, -1.0], np.float32), np.array([2.0, 3.0], np.float32))  # widths 2 and 4


def rngs(rows: int, seed: int = 0) -> list[np.random.Generator]:
    return [np.random.default_rng([seed, row]) for row in range(rows)]


def observations(env_id: str, rows: int) -> np.ndarray:
    """`rows` observations from seeded resets of the env."""
    env = make_env(env_id)
    try:
        return np.stack([env.reset(seed=i)[0] for i in range(rows)])
    finally:
        env.close()


def test_random_logp_is_minus_log_n_for_discrete_and_its_samples_are_uniform():
    policy = RandomPolicy(DISCRETE)
    actions, logp = policy.act(np.zeros((3000, 1)), rngs(3000), [None] * 3000)
    assert logp.dtype == np.float32 and logp.shape == (3000,)
    np.testing.assert_allclose(logp, -math.log(3), rtol=1e-6)
    assert set(actions.tolist()) == {0, 1, 2}
    np.testing.assert_allclose(np.bincount(actions) / 3000, [1 / 3] * 3, atol=0.03)


def test_random_logp_is_minus_the_log_volume_of_a_box_and_its_samples_lie_inside():
    policy = RandomPolicy(BOX)
    actions, logp = policy.act(np.zeros((2000, 1)), rngs(2000), [None] * 2000)
    np.testing.assert_allclose(logp, -(math.log(2.0) + math.log(4.0)), rtol=1e-6)  # density 1/8
    assert actions.dtype == np.float32 and actions.shape == (2000, 2)
    assert np.all(actions >= BOX.low) and np.all(actions <= BOX.high)
    np.testing.assert_allclose(actions.mean(axis=0), [1.0, 1.0], atol=0.1)
    np.testing.assert_allclose(RandomPolicy(env_spaces("Pendulum-v1")[1]).logp, -math.log(4.0), rtol=1e-6)


def test_random_actions_depend_only_on_each_rows_generator():
    policy = RandomPolicy(BOX)
    whole, _ = policy.act(np.zeros((6, 1)), rngs(6), [None] * 6)
    # Rows 3..5 alone, with the same generators: the same actions.
    part, _ = policy.act(np.zeros((3, 1)), rngs(6)[3:], [None] * 3)
    np.testing.assert_array_equal(whole[3:], part)


def callable_policy(name: str, env_id: str = "Acrobot-v1", noise: float = 0.0) -> CallablePolicy:
    env = make_env(env_id)
    try:
        return CallablePolicy(name, env, noise)
    finally:
        env.close()


def test_a_callable_acts_as_the_controller_with_probability_one():
    obs = observations("Acrobot-v1", 50)
    actions, logp = callable_policy("examples.controllers:acrobot").act(obs, rngs(50), [None] * 50)
    np.testing.assert_array_equal(actions, acrobot(obs))
    np.testing.assert_array_equal(logp, np.zeros(50, dtype=np.float32))


def test_a_callable_on_continuous_actions_reports_no_density():
    obs = observations("Pendulum-v1", 10)
    policy = callable_policy("examples.controllers:pendulum", "Pendulum-v1")
    actions, logp = policy.act(obs, rngs(10), [None] * 10)
    assert logp is None and not policy.with_logp
    np.testing.assert_array_equal(actions, pendulum(obs))
    noisy = callable_policy("examples.controllers:pendulum", "Pendulum-v1", noise=0.1)
    assert noisy.act(obs, rngs(10), [None] * 10)[1] is None and not noisy.with_logp


def test_a_callable_refuses_action_noise_on_discrete_actions():
    with pytest.raises(UserError, match="action_noise applies to continuous actions; examples.controllers:cartpole's "
                                        "are discrete: use kind 'mixture' with epsilon instead"):
        callable_policy("examples.controllers:cartpole", "CartPole-v1", noise=0.2)


def test_a_callable_that_reports_log_probabilities_fills_them(user_code):
    policy = callable_policy("corridor_sim.control:hesitant", CORRIDOR)
    assert policy.with_logp and not policy.deterministic
    obs = np.array([[0.25, 0.0], [0.5, 0.0]], dtype=np.float32)
    actions, logp = policy.act(obs, rngs(2), [None] * 2)
    assert set(actions.tolist()) <= {1, 2}
    np.testing.assert_allclose(np.exp(logp), np.where(actions == 2, 0.8, 0.2), rtol=1e-6)


@pytest.mark.parametrize("name,message", [
    ("corridor_sim.control:missing", "cannot be imported"),
    ("corridor_sim.nowhere:walk_right", "cannot be imported"),
    ("corridor_sim.control:NOT_A_FUNCTION", "is not callable"),
    ("corridor_sim.control:raises", "raised RuntimeError: controller lost its calibration; fix the function"),
    ("corridor_sim.control:two_columns", r"returned actions of shape \(1, 2\) and dtype int64 for 1 observations; "
                                          r"the action space Discrete\(3\) needs shape \(1,\) of integers"),
    ("corridor_sim.control:beyond_the_space", "returned 7, outside the action space Discrete"),
])
def test_a_broken_callable_is_refused_in_one_line_naming_it(user_code, name, message):
    with pytest.raises(UserError, match=message) as err:
        callable_policy(name, CORRIDOR)
    assert f"behaviour policy {name}" in str(err.value) and "\n" not in str(err.value)


def test_mixture_logp_is_the_mixture_formula_and_matches_its_action_frequencies():
    """epsilon 0.3 over Acrobot's 3 actions: the expert's action has p = 0.7 + 0.1, each other one p = 0.1."""
    rows, epsilon = 20_000, 0.3
    env = make_env("Acrobot-v1")
    obs = np.tile(observations("Acrobot-v1", 20), (rows // 20, 1))
    expert = acrobot(obs)
    policy = build_policy(mixture(ACROBOT_EXPERT, epsilon), env)
    actions, logp = policy.act(obs, rngs(rows), [env] * rows)

    is_expert = actions == expert
    np.testing.assert_allclose(np.exp(logp[is_expert]), (1 - epsilon) + epsilon / 3, rtol=1e-6)
    np.testing.assert_allclose(np.exp(logp[~is_expert]), epsilon / 3, rtol=1e-6)
    # Empirical frequencies of the expert's action and of each other action agree with those probabilities.
    assert is_expert.mean() == pytest.approx(0.8, abs=0.015)
    for other in (0, 1, 2):
        chosen = (actions == other) & ~is_expert
        assert chosen.sum() / rows == pytest.approx(0.1 * np.mean(expert != other), abs=0.01)
    # Seeded per row: the same generators give the same actions.
    again, _ = policy.act(obs, rngs(rows), [env] * rows)
    np.testing.assert_array_equal(actions, again)


def test_mixture_extremes_are_the_base_and_the_uniform_policy():
    env = make_env("CartPole-v1")
    obs = observations("CartPole-v1", 400)
    expert = cartpole(obs)
    actions, logp = build_policy(mixture(CARTPOLE_EXPERT, 0.0), env).act(obs, rngs(400), [env] * 400)
    np.testing.assert_array_equal(actions, expert)
    np.testing.assert_allclose(logp, 0.0, atol=1e-7)
    actions, logp = build_policy(mixture(CARTPOLE_EXPERT, 1.0), env).act(obs, rngs(400), [env] * 400)
    np.testing.assert_allclose(logp, math.log(0.5), rtol=1e-6)
    assert 0.4 < np.mean(actions == expert) < 0.6


def test_mixture_on_continuous_actions_reports_no_density_and_stays_in_bounds():
    env = make_env("Pendulum-v1")
    obs = observations("Pendulum-v1", 200)
    actions, logp = build_policy(mixture(PENDULUM_EXPERT, 0.5), env).act(obs, rngs(200), [None] * 200)
    assert logp is None
    assert np.all(np.abs(actions) <= 2.0)
    assert 0.35 < np.mean(np.all(actions == pendulum(obs), axis=1)) < 0.65


def test_mixture_over_a_base_that_samples_knows_no_log_probabilities(user_code):
    env = make_env(CORRIDOR)
    assert not build_policy(mixture(PolicyConfig(kind="callable", callable="corridor_sim.control:hesitant"), 0.1),
                            env).with_logp
    assert build_policy(mixture(PolicyConfig(kind="callable", callable="corridor_sim.control:walk_right"), 0.1),
                        env).with_logp


def test_worker_env_vars_make_a_relative_sqlite_store_absolute(tmp_path, monkeypatch, tracking_uri):
    monkeypatch.chdir(tmp_path)
    tracking_uri("sqlite:///stores/mlflow.db")
    config = PolicyConfig(kind="model", model="models:/CartPole-v1-bc@newest")
    env = worker_env_vars(config)
    assert env == {"MLFLOW_TRACKING_URI": f"sqlite:///{(tmp_path / 'stores' / 'mlflow.db').resolve()}"}
    assert env["MLFLOW_TRACKING_URI"].startswith("sqlite:////")


@pytest.mark.parametrize("uri", ["sqlite:////var/store/mlflow.db", "http://127.0.0.1:5000"])
def test_worker_env_vars_pass_absolute_stores_unchanged(uri, monkeypatch, tracking_uri):
    tracking_uri(uri)
    assert worker_env_vars(PolicyConfig(kind="model", model="runs:/0123/policy")) == {"MLFLOW_TRACKING_URI": uri}


@pytest.mark.parametrize("config", [
    PolicyConfig(kind="random"), CARTPOLE_EXPERT, mixture(CARTPOLE_EXPERT, 0.2),
    PolicyConfig(kind="model", model="runs/bc-cartpole-expert/checkpoint"),
])
def test_worker_env_vars_are_empty_for_policies_not_loaded_from_mlflow(config, monkeypatch, tracking_uri):
    tracking_uri("sqlite:///mlflow.db")
    assert worker_env_vars(config) == {}


def test_build_policy_builds_each_kind(tmp_path, monkeypatch, tracking_uri):
    from ray.rllib.algorithms.bc import BCConfig

    env = make_env("CartPole-v1")
    assert type(build_policy(PolicyConfig(kind="random"), env)) is RandomPolicy
    assert type(build_policy(CARTPOLE_EXPERT, env)) is CallablePolicy
    mixed = build_policy(mixture(CARTPOLE_EXPERT, 0.25), env)
    assert type(mixed) is MixturePolicy and mixed.epsilon == 0.25 and type(mixed.base) is CallablePolicy

    # kind model: an RLModule directory, loaded and sampling valid actions with their log-probs.
    observation_space, action_space = env_spaces("CartPole-v1")
    BCConfig().environment(observation_space=observation_space, action_space=action_space) \
        .get_rl_module_spec().build().save_to_path(tmp_path / "module")
    policy = build_policy(PolicyConfig(kind="model", model=str(tmp_path / "module")), env)
    assert type(policy) is ModulePolicy and not policy.greedy
    actions, logp = policy.act(observations("CartPole-v1", 8), rngs(8), [None] * 8)
    assert set(actions.tolist()) <= {0, 1} and logp.shape == (8,) and np.all(logp < 0)
    greedy = build_policy(PolicyConfig(kind="model", model=str(tmp_path / "module"), greedy=True), env)
    assert greedy.greedy

    # A directory that is no checkpoint, and an MLflow URI the store does not know, are user errors.
    with pytest.raises(UserError, match="is not a checkpoint made by `orl train`"):
        build_policy(PolicyConfig(kind="model", model=str(tmp_path)), env)
    tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(UserError, match="cannot load MLflow model 'models:/CartPole-v1-bc@newest'"):
        build_policy(PolicyConfig(kind="model", model="models:/CartPole-v1-bc@newest"), env)


@pytest.mark.parametrize("algo", ["bc", "dqn"])
def test_a_temperature_samples_softmax_of_the_logits_or_q_values_over_them(algo, tmp_path):
    """The softmax version of a policy (behaviour kind model, `orl ope --temperature`): its probabilities are
    softmax(logits / T), a DQN's Q-values as logits; its samples follow them and report their log-probabilities."""
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.algorithms.dqn import DQNConfig

    env = make_env("CartPole-v1")
    observation_space, action_space = env_spaces("CartPole-v1")
    config = {"bc": BCConfig, "dqn": DQNConfig}[algo]().environment(observation_space=observation_space,
                                                                     action_space=action_space)
    config.get_rl_module_spec().build().save_to_path(tmp_path / "module")
    obs = observations("CartPole-v1", 4)
    own = build_policy(PolicyConfig(kind="model", model=str(tmp_path / "module")), env)
    logits = own.distribution_inputs(obs)
    for temperature in (0.5, 3.0):
        policy = build_policy(PolicyConfig(kind="model", model=str(tmp_path / "module"), temperature=temperature),
                              env)
        expected = np.exp(logits / temperature) / np.exp(logits / temperature).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(policy.probabilities(obs), expected, rtol=1e-5)
        rows = np.repeat(obs[:1], 4000, axis=0)
        actions, logp = policy.act(rows, rngs(4000), [None] * 4000)
        assert abs(np.mean(actions == 1) - expected[0, 1]) < 0.03
        np.testing.assert_allclose(np.exp(logp), expected[0, actions], rtol=1e-5)
    with pytest.raises(ValueError, match="temperature -1.0 applies to kind 'model' sampling its actions"):
        PolicyConfig(kind="model", model="runs/x/checkpoint", temperature=-1.0)
    with pytest.raises(ValueError, match="temperature 1.0 applies to kind 'model' sampling its actions"):
        PolicyConfig(kind="model", model="runs/x/checkpoint", greedy=True, temperature=1.0)
