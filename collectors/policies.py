"""Behaviour policies. Each acts on a batch of observations, one row per environment.

Every row has its own random generator (that of the episode the row belongs to), so an episode's actions
depend only on its seed, not on which actor or batch slot ran it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

import gymnasium as gym
import numpy as np

from collectors.config import PolicyConfig
from common.envs import EXPERTS
from common.errors import UserError
from common.trained_policy import MLflowPolicy, ModulePolicy, is_mlflow_uri, load_rl_module


class Policy(Protocol):
    def act(self, obs: np.ndarray, rngs: list[np.random.Generator], envs: list[gym.Env]):
        """(obs batch, one rng per row, one env per row) -> (actions, log-probs or None)."""


class RandomPolicy(Policy):
    def __init__(self, action_space: gym.Space):
        self.space = action_space
        if isinstance(action_space, gym.spaces.Discrete):
            self.logp = -math.log(action_space.n)
        else:
            self.logp = -float(np.sum(np.log(action_space.high - action_space.low)))

    def sample(self, rng: np.random.Generator):
        if isinstance(self.space, gym.spaces.Discrete):
            return int(rng.integers(self.space.n))
        return rng.uniform(self.space.low, self.space.high).astype(np.float32)

    def act(self, obs, rngs, envs):
        actions = np.array([self.sample(rng) for rng in rngs])
        return actions, np.full(len(rngs), self.logp, dtype=np.float32)


class ExpertPolicy(Policy):
    """The env's hand-written controller; on continuous actions, optionally with Gaussian noise of
    `noise` × half the action range (clipped to the bounds, so its density is moot)."""

    def __init__(self, env_id: str, action_space: gym.Space, noise: float = 0.0):
        self.expert = EXPERTS[env_id]
        self.space = action_space
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if noise and self.discrete:
            raise UserError(f"action_noise applies to continuous actions; {env_id}'s are discrete: "
                            "use kind 'mixture' with epsilon instead")
        self.noise_std = noise * (action_space.high - action_space.low) / 2 if noise else None

    def act(self, obs, rngs, envs):
        actions = np.array([self.expert(o, env) for o, env in zip(obs, envs)])
        if self.noise_std is not None:
            noise = np.stack([rng.standard_normal(actions.shape[1]) for rng in rngs]) * self.noise_std
            actions = np.clip(actions + noise, self.space.low, self.space.high).astype(np.float32)
        # A deterministic discrete choice has probability 1; a point mass has no density.
        return actions, (np.zeros(len(obs), dtype=np.float32) if self.discrete else None)


class MixturePolicy(Policy):
    """The expert (with its action noise, if any), except a uniformly random action with probability epsilon."""

    def __init__(self, env_id: str, action_space: gym.Space, epsilon: float, noise: float = 0.0):
        self.expert = ExpertPolicy(env_id, action_space, noise)
        self.random = RandomPolicy(action_space)
        self.epsilon = epsilon
        self.n = action_space.n if isinstance(action_space, gym.spaces.Discrete) else None

    def act(self, obs, rngs, envs):
        expert_actions, _ = self.expert.act(obs, rngs, envs)
        explore = np.array([rng.random() < self.epsilon for rng in rngs])
        actions = np.array(
            [self.random.sample(rng) if e else a for rng, e, a in zip(rngs, explore, expert_actions)]
        )
        if self.n is None:
            return actions, None
        prob = (1 - self.epsilon) * (actions == expert_actions) + self.epsilon / self.n
        return actions, np.log(prob).astype(np.float32)


def worker_env_vars(config: PolicyConfig) -> dict[str, str]:
    """Environment that Ray workers need to build this policy: the driver's MLflow tracking store, as an
    absolute URI (workers run in other directories, or on other machines)."""
    if config.kind != "model" or not is_mlflow_uri(config.model):
        return {}
    import mlflow

    uri = mlflow.get_tracking_uri()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    return {"MLFLOW_TRACKING_URI": uri}


def knows_logp(config: PolicyConfig, action_space: gym.Space) -> bool:
    """Whether the policy reports action log-probabilities (so datasets carry `action_logp`)."""
    # Uniform densities are known for Box too; the other policies are deterministic or clipped there.
    return config.kind == "random" or isinstance(action_space, gym.spaces.Discrete)


def build_policy(config: PolicyConfig, env_id: str, action_space: gym.Space) -> Policy:
    if config.kind == "random":
        return RandomPolicy(action_space)
    if config.kind == "expert":
        return ExpertPolicy(env_id, action_space, config.action_noise)
    if config.kind == "mixture":
        return MixturePolicy(env_id, action_space, config.epsilon, config.action_noise)
    if is_mlflow_uri(config.model):
        return MLflowPolicy(config.model, action_space)
    return ModulePolicy(load_rl_module(config.model), action_space, config.greedy)
