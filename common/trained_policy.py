"""Trained policies: an RLModule saved by `orl train` (or `orl train-online`), or an MLflow model, loaded and
acting on a batch of observations. Collectors act with them (behaviour policy kind `model`), evaluation scores
them, and the MLflow pyfunc serves them.

Each acts as collectors' behaviour policies do: `act(obs, rngs, envs) -> (actions, log-probs or None)`, with
one random generator per row.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

from common.errors import UserError
from common.observations import ModelInput

# Where `Algorithm.save_to_path` puts the single-agent RLModule inside a checkpoint.
MODULE_SUBDIR = Path("learner_group", "learner", "rl_module", "default_policy")


class ModulePolicy:
    """A trained RLlib RLModule: samples from its action distribution, or takes its mode when greedy. With a
    `temperature` (Discrete actions) it samples from softmax(logits / temperature) instead: a stochastic version of a
    greedy policy, the Q-values of DQN and CQL serving as logits."""

    def __init__(self, module, action_space: gym.Space, greedy: bool, temperature: float | None = None):
        from ray.rllib.core.distribution.torch.torch_distribution import TorchSquashedGaussian

        from common.action_distributions import TorchBoundedMeanGaussian, TorchTanhDeterministic

        if temperature is not None and (greedy or not isinstance(action_space, gym.spaces.Discrete)):
            raise ValueError("a temperature applies to a policy sampling Discrete actions")
        self.module = module
        self.space = action_space
        self.greedy = greedy
        self.temperature = temperature
        self.model_input = ModelInput.of_module(module)  # None: vectors, taken as they are
        # Its distribution over discrete actions; a Box's clipped samples have no density.
        self.with_logp = isinstance(action_space, gym.spaces.Discrete)
        distribution = module.get_inference_action_dist_cls()
        self.squashed = issubclass(distribution, TorchSquashedGaussian)
        self.bounded_mean = issubclass(distribution, TorchBoundedMeanGaussian)
        self.tanh_deterministic = issubclass(distribution, TorchTanhDeterministic)  # BC's `deterministic`
        self.deterministic = greedy or self.tanh_deterministic

    def distribution_inputs(self, obs: np.ndarray) -> np.ndarray:
        import torch

        obs = self.model_input(obs) if self.model_input is not None else obs
        batch = {"obs": torch.tensor(obs, dtype=torch.float32)}  # a copy: dataset arrays are read-only
        with torch.no_grad():
            out = self.module.forward_inference(batch)
            if "action_dist_inputs" in out:
                return out["action_dist_inputs"].numpy()
            # Value-based modules (DQN) infer greedy actions only; their Q-values serve as logits (Boltzmann).
            return self.module.compute_q_values(batch)["qf_preds"].numpy()

    def probabilities(self, obs: np.ndarray) -> np.ndarray:
        """Each row's probability of every action of a Discrete space, as `act` chooses: 1 on the most likely
        action when greedy (off-policy evaluation weighs logged actions by it)."""
        logp_all = self._log_probabilities(self.distribution_inputs(obs))
        if self.greedy:
            return np.eye(self.space.n, dtype=np.float64)[logp_all.argmax(axis=1)]
        return np.exp(logp_all)

    def act(self, obs, rngs, envs):
        inputs = self.distribution_inputs(obs)
        if isinstance(self.space, gym.spaces.Discrete):
            logp_all = self._log_probabilities(inputs)
            if self.greedy:  # deterministic: the chosen action has probability 1
                actions = logp_all.argmax(axis=1)
                return actions, np.zeros(len(actions), dtype=np.float32)
            # Inverse-CDF sampling with each row's own generator.
            cdf = np.cumsum(np.exp(logp_all), axis=1)
            u = np.array([rng.random() for rng in rngs])[:, None] * cdf[:, -1:]
            actions = (u > cdf).sum(axis=1).clip(max=self.space.n - 1)
            return actions, logp_all[np.arange(len(actions)), actions].astype(np.float32)
        # Box: RLlib's (diagonal or tanh-squashed) Gaussian takes [mean, log_std]; clipping to the bounds makes
        # density moot. A deterministic policy's inputs are its action before the tanh.
        if self.tanh_deterministic:
            mean = np.tanh(inputs)
        else:
            mean, log_std = np.split(inputs, 2, axis=1)
            if self.bounded_mean:
                mean = np.tanh(mean)
            if not self.greedy:
                noise = np.stack([rng.standard_normal(mean.shape[1]) for rng in rngs])
                mean = mean + np.exp(log_std) * noise
            if self.squashed:
                mean = np.tanh(mean)
        if self.squashed or self.bounded_mean or self.tanh_deterministic:  # act in [-1, 1] (offline_cql.py)
            mean = self.space.low + (np.clip(mean, -1.0, 1.0) + 1.0) / 2.0 * (self.space.high - self.space.low)
        actions = np.clip(mean, self.space.low, self.space.high).astype(np.float32)
        return actions, None

    def _log_probabilities(self, logits: np.ndarray) -> np.ndarray:
        return _log_softmax(logits if self.temperature is None else logits / self.temperature)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    return logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)


class MLflowPolicy:
    """A policy logged by `orl train` as an MLflow pyfunc model (observations in, greedy actions out)."""

    def __init__(self, uri: str, action_space: gym.Space):
        import mlflow.pyfunc

        try:
            self.model = mlflow.pyfunc.load_model(uri)
        except Exception as err:  # MLflow raises several types for a URI it cannot resolve
            raise UserError(f"cannot load MLflow model '{uri}' ({type(err).__name__}); check the URI and "
                            "MLFLOW_TRACKING_URI") from None
        self.discrete = self.with_logp = isinstance(action_space, gym.spaces.Discrete)
        self.deterministic = True  # greedy actions
        # What its signature takes: float32 vectors, or images at their own dtype (tracking/runs.py).
        self.input_dtype = self.model.metadata.get_input_schema().inputs[0].type

    def act(self, obs, rngs, envs):
        actions = np.asarray(self.model.predict(np.asarray(obs).astype(self.input_dtype, copy=False)))
        return actions, (np.zeros(len(obs), dtype=np.float32) if self.discrete else None)


def is_mlflow_uri(model: str) -> bool:
    return "://" in model or model.startswith(("models:/", "runs:/"))


def load_rl_module(path: str | Path):
    """The RLModule in an `orl train` checkpoint directory (or in a bare RLModule directory)."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    path = Path(path)
    module_dir = path / MODULE_SUBDIR if (path / MODULE_SUBDIR).is_dir() else path
    if not (module_dir / "class_and_ctor_args.pkl").is_file():
        raise UserError(f"{path} is not a checkpoint made by `orl train`; point at its checkpoint directory")
    return RLModule.from_checkpoint(module_dir.resolve())
