"""Behaviour policies. Each acts on a batch of observations, one row per environment.

Every row has its own random generator (that of the episode the row belongs to), so an episode's actions
depend only on its seed, not on which actor or batch slot ran it.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Protocol

import gymnasium as gym
import numpy as np

from collectors.config import PolicyConfig
from common.errors import UserError, first_line
from common.trained_policy import MLflowPolicy, ModulePolicy, is_mlflow_uri, load_rl_module


class Policy(Protocol):
    with_logp: bool
    """Whether `act` returns log-probabilities (so datasets carry `action_logp`)."""
    deterministic: bool
    """Whether its action is a function of the observation alone (a mixture's log-probabilities need it)."""

    def act(self, obs: np.ndarray, rngs: list[np.random.Generator], envs: list[gym.Env]):
        """(obs batch, one rng per row, one env per row) -> (actions, log-probs or None)."""


class RandomPolicy(Policy):
    def __init__(self, action_space: gym.Space):
        self.space = action_space
        if isinstance(action_space, gym.spaces.Discrete):
            self.logp = -math.log(action_space.n)
        else:
            self.logp = -float(np.sum(np.log(action_space.high - action_space.low)))
        self.with_logp = True  # uniform densities are known for Box too
        self.deterministic = False

    def sample(self, rng: np.random.Generator):
        if isinstance(self.space, gym.spaces.Discrete):
            return int(rng.integers(self.space.n))
        return rng.uniform(self.space.low, self.space.high).astype(np.float32)

    def act(self, obs, rngs, envs):
        actions = np.array([self.sample(rng) for rng in rngs])
        return actions, np.full(len(rngs), self.logp, dtype=np.float32)


class CallablePolicy(Policy):
    """A user's controller, `package.module:function`: it takes a batch of observations (one row per environment)
    and returns a batch of actions, or (actions, log-probabilities). One that returns actions alone is taken as
    deterministic: probability 1 for a Discrete space, no density for a Box. Every batch it returns is checked
    against the action space, and a wrong one is refused naming the function.

    On continuous actions, `noise` adds Gaussian noise of `noise` × half the action range (clipped to the bounds,
    so its density is moot)."""

    def __init__(self, name: str, env: gym.Env, noise: float = 0.0):
        self.name, self.space = name, env.action_space
        self.function = _import_callable(name)
        self.discrete = isinstance(self.space, gym.spaces.Discrete)
        if noise and self.discrete:
            raise UserError(f"action_noise applies to continuous actions; {name}'s are discrete: "
                            "use kind 'mixture' with epsilon instead")
        self.noise_std = noise * (self.space.high - self.space.low) / 2 if noise else None
        # One call on a reset's observation tells whether it reports log-probabilities, and fails here, before any
        # actor starts, if it is broken.
        obs, _ = env.reset(seed=0)
        self.returns_logp = self._call(np.stack([obs]))[1] is not None
        self.with_logp = self.discrete or self.returns_logp and self.noise_std is None
        self.deterministic = not self.returns_logp

    def _call(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        try:
            out = self.function(obs)
        except Exception as err:
            raise UserError(f"behaviour policy {self.name} raised {type(err).__name__}: {first_line(err)}; fix the "
                            "function") from None
        actions, logp = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
        return _checked_actions(self.name, actions, self.space, len(obs)), _checked_logp(self.name, logp, len(obs))

    def act(self, obs, rngs, envs):
        actions, logp = self._call(obs)
        if self.noise_std is not None:
            noise = np.stack([rng.standard_normal(actions.shape[1]) for rng in rngs]) * self.noise_std
            actions = np.clip(actions + noise, self.space.low, self.space.high).astype(np.float32)
            return actions, None
        if logp is None and self.discrete:  # deterministic: the chosen action has probability 1
            logp = np.zeros(len(obs), dtype=np.float32)
        return actions, logp


class MixturePolicy(Policy):
    """The base policy, except a uniformly random action with probability epsilon."""

    def __init__(self, base: Policy, action_space: gym.Space, epsilon: float):
        self.base = base
        self.random = RandomPolicy(action_space)
        self.epsilon = epsilon
        self.n = action_space.n if isinstance(action_space, gym.spaces.Discrete) else None
        # Known only over a deterministic base on discrete actions.
        self.with_logp = self.n is not None and base.deterministic

    def act(self, obs, rngs, envs):
        base_actions, _ = self.base.act(obs, rngs, envs)
        explore = np.array([rng.random() < self.epsilon for rng in rngs])
        actions = np.array(
            [self.random.sample(rng) if e else a for rng, e, a in zip(rngs, explore, base_actions)]
        )
        if not self.with_logp:
            return actions, None
        # A deterministic base: (1 - epsilon) on its action, and epsilon spread over all n.
        prob = (1 - self.epsilon) * (actions == base_actions) + self.epsilon / self.n
        return actions, np.log(prob).astype(np.float32)


def _import_callable(name: str):
    module, _, attr = name.partition(":")
    try:
        function = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise UserError(f"behaviour policy {name} cannot be imported ({err}); install its package or put it on "
                        "PYTHONPATH") from None
    if not callable(function):
        raise UserError(f"behaviour policy {name} is not callable; name a function taking an observation batch")
    return function


def _checked_actions(name: str, actions, space: gym.Space, rows: int) -> np.ndarray:
    actions = np.asarray(actions)
    if isinstance(space, gym.spaces.Discrete):
        expected, ok_dtype = (rows,), np.issubdtype(actions.dtype, np.integer)
    else:
        expected, ok_dtype = (rows, *space.shape), np.issubdtype(actions.dtype, np.floating)
    if actions.shape != expected or not ok_dtype:
        raise UserError(f"behaviour policy {name} returned actions of shape {actions.shape} and dtype "
                        f"{actions.dtype} for {rows} observations; the action space {space} needs shape {expected} "
                        f"of {'integers' if isinstance(space, gym.spaces.Discrete) else 'floats'}")
    if isinstance(space, gym.spaces.Discrete):
        outside = (actions < space.start) | (actions >= space.start + space.n)
    else:
        actions = actions.astype(space.dtype)
        outside = ((actions < space.low) | (actions > space.high)).reshape(rows, -1).any(axis=1)
    if outside.any():
        raise UserError(f"behaviour policy {name} returned {actions[outside][0].tolist()}, outside the action space "
                        f"{space}; keep its actions inside it")
    return actions


def _checked_logp(name: str, logp, rows: int) -> np.ndarray | None:
    if logp is None:
        return None
    logp = np.asarray(logp, dtype=np.float32)
    if logp.shape != (rows,) or not np.all(logp <= 0):
        raise UserError(f"behaviour policy {name} returned log-probabilities of shape {logp.shape} for {rows} "
                        "observations; return one log-probability (<= 0) per row")
    return logp


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


def build_policy(config: PolicyConfig, env: gym.Env) -> Policy:
    """The policy `config` describes, for `env`'s spaces (a callable is tried once on a reset of it)."""
    if config.kind == "random":
        return RandomPolicy(env.action_space)
    if config.kind == "callable":
        return CallablePolicy(config.callable, env, config.action_noise)
    if config.kind == "mixture":
        return MixturePolicy(build_policy(config.base, env), env.action_space, config.epsilon)
    if is_mlflow_uri(config.model):
        if config.temperature is not None:
            raise UserError(f"temperature applies to an `orl train` checkpoint, not to {config.model}, whose MLflow "
                            "model serves its greedy actions; name the run's checkpoint directory")
        return MLflowPolicy(config.model, env.action_space)
    if config.temperature is not None and not isinstance(env.action_space, gym.spaces.Discrete):
        raise UserError(f"temperature applies to Discrete actions; {config.model} acts in {env.action_space}")
    return ModulePolicy(load_rl_module(config.model), env.action_space, config.greedy, config.temperature)
