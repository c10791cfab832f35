"""Supported environments and a hand-written expert controller for each.

The experts are deterministic functions of the observation; their returns are measured by `orl reference`
(references/).
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np

from common.errors import UserError


def _cartpole_expert(obs: np.ndarray, env: gym.Env) -> int:
    x, x_dot, theta, theta_dot = obs
    # Push towards where the pole is falling, with a weak pull back to the centre.
    return int(theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0)


def _acrobot_expert(obs: np.ndarray, env: gym.Env) -> int:
    # Torque along the second joint's velocity pumps energy into the swing.
    return 2 if obs[5] > 0 else 0


def _pendulum_expert(obs: np.ndarray, env: gym.Env) -> np.ndarray:
    cos_theta, sin_theta, theta_dot = obs
    if cos_theta > 0.85:  # near the top: PD stabilisation
        torque = -(10.0 * np.arctan2(sin_theta, cos_theta) + 2.0 * theta_dot)
    else:  # energy pumping until the swing carries the pendulum up
        energy = 0.5 * theta_dot**2 + 10.0 * (cos_theta - 1.0)
        torque = 2.0 * np.sign(theta_dot) * (1.0 if energy < 0 else -1.0)
    return np.array([np.clip(torque, -2.0, 2.0)], dtype=np.float32)


def _lunar_lander_expert(obs: np.ndarray, env: gym.Env) -> int:
    from gymnasium.envs.box2d.lunar_lander import heuristic

    return int(heuristic(env.unwrapped, obs))


Expert = Callable[[np.ndarray, gym.Env], "int | np.ndarray"]

EXPERTS: dict[str, Expert] = {
    "CartPole-v1": _cartpole_expert,
    "Acrobot-v1": _acrobot_expert,
    "Pendulum-v1": _pendulum_expert,
    "LunarLander-v3": _lunar_lander_expert,
}


def check_env_id(env_id: str) -> None:
    if env_id not in EXPERTS:
        raise UserError(f"unknown env id '{env_id}': supported are {', '.join(EXPERTS)}")


def make_env(env_id: str) -> gym.Env:
    check_env_id(env_id)
    try:
        return gym.make(env_id)
    except gym.error.DependencyNotInstalled as err:
        raise UserError(f"{env_id} needs an extra package ({err}); install the project's pinned requirements") from None


def step_actions(actions: np.ndarray, action_space: gym.Space) -> list | np.ndarray:
    """A batch of policy actions as `env.step` takes them fastest: Python ints for a Discrete space, where
    gymnasium's check that an action is in the space is slow for numpy integers."""
    return actions.tolist() if isinstance(action_space, gym.spaces.Discrete) else actions


def env_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    env = make_env(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()
