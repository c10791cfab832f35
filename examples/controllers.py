"""Hand-written controllers for Gymnasium's classic-control and Box2D tasks: behaviour policies of kind
`callable` (`callable: examples.controllers:cartpole`), and the expert references of the quick tour and the
full suite (params.yaml's `references:`).

A controller takes a batch of observations, one row per environment, and returns a batch of actions. These are
deterministic, so they return no log-probabilities (collectors/policies.py's `CallablePolicy` documents the
contract). Each is a per-row function mapped over the batch, so their actions, and the datasets collected with
them, are bit-for-bit those of the expert table they replace.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def _cartpole_one(obs: np.ndarray) -> int:
    x, x_dot, theta, theta_dot = obs
    # Push towards where the pole is falling, with a weak pull back to the centre.
    return int(theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0)


def _acrobot_one(obs: np.ndarray) -> int:
    # Torque along the second joint's velocity pumps energy into the swing.
    return 2 if obs[5] > 0 else 0


def _pendulum_one(obs: np.ndarray) -> np.ndarray:
    cos_theta, sin_theta, theta_dot = obs
    if cos_theta > 0.85:  # near the top: PD stabilisation
        torque = -(10.0 * np.arctan2(sin_theta, cos_theta) + 2.0 * theta_dot)
    else:  # energy pumping until the swing carries the pendulum up
        energy = 0.5 * theta_dot**2 + 10.0 * (cos_theta - 1.0)
        torque = 2.0 * np.sign(theta_dot) * (1.0 if energy < 0 else -1.0)
    return np.array([np.clip(torque, -2.0, 2.0)], dtype=np.float32)


# gymnasium's heuristic reads only whether the lander's actions are continuous.
_DISCRETE_LANDER = SimpleNamespace(unwrapped=SimpleNamespace(continuous=False))


def _lunar_lander_one(obs: np.ndarray) -> int:
    from gymnasium.envs.box2d.lunar_lander import heuristic

    return int(heuristic(_DISCRETE_LANDER, obs))


def cartpole(obs: np.ndarray) -> np.ndarray:
    """CartPole-v1: balances the pole for all 500 steps."""
    return np.array([_cartpole_one(o) for o in obs])


def acrobot(obs: np.ndarray) -> np.ndarray:
    """Acrobot-v1: swings up in about 80 steps."""
    return np.array([_acrobot_one(o) for o in obs])


def pendulum(obs: np.ndarray) -> np.ndarray:
    """Pendulum-v1: energy pumping, then PD stabilisation at the top."""
    return np.array([_pendulum_one(o) for o in obs])


def lunar_lander(obs: np.ndarray) -> np.ndarray:
    """LunarLander-v3 (discrete): gymnasium's own heuristic lander."""
    return np.array([_lunar_lander_one(o) for o in obs])
