"""The RLlib pieces our offline algorithms share, side by side here rather than borrowed from a sibling algorithm.

- `WithoutEnvRunners`: algorithms derived from RLlib's DQN (DQN; CQL through SAC) set up without env runners.
- `ConcatQCatalog`: SAC's catalog with the Q-network of the CQL paper and d3rlpy, one MLP over the observation and
  action concatenated, for CQL and IQL. RLlib's SAC catalog gives Q(s, a) a multi-stream network: one MLP for the
  observation, one for the action, then a 2-layer tanh fusion net with skip connections, several times the
  multiply-adds, which CQL evaluates on 10 sampled actions per row (docs/algorithms.md). Where the module's
  `model_config` sets `CRITIC_LAYER_NORM`, each of its layers is layer-normalized (RLlib's `fcnet_use_layernorm`,
  which would normalize the policy's layers too).
- `TargetsPerUpdate`: target networks that follow the online ones per gradient update, for our learners derived
  from RLlib's DQN learner (DQN, CQL through SAC, and IQL). RLlib 2.60's DQNLearner moves targets once per
  `Learner.update` call, and only when the env steps sampled since the last move reach
  `target_network_update_freq`. Offline, one call is a whole iteration of many gradient updates: DQN's targets
  synced once per iteration, and SAC-style Polyak averaging (tau = 0.005, CQL's and IQL's) moved them 0.5 % per
  iteration where the papers move them 0.5 % per update, so the critics' targets stayed near their random
  initialisation for the whole run.
"""

from __future__ import annotations

import dataclasses

import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.dqn.dqn_learner import DQNLearner
from ray.rllib.algorithms.sac.sac_catalog import SACCatalog
from ray.rllib.core.columns import Columns
from ray.rllib.core.models.base import ENCODER_OUT
from ray.rllib.core.models.configs import MLPEncoderConfig
from ray.rllib.core.models.torch.encoder import TorchMLPEncoder
from ray.rllib.utils.metrics import NUM_TARGET_UPDATES

from training.algorithms.rllib_internals import encoder_config, foreach_lerp_, private_hook, skip_stateful_module_check


class WithoutEnvRunners:
    """Mixin for algorithms derived from RLlib's DQN (SAC and CQL are too) that train offline: DQN.setup asks
    env runners whether the module is stateful, and offline there are none."""

    def setup(self, config) -> None:
        Algorithm.setup(self, config)
        skip_stateful_module_check(self)


class ConcatQEncoder(TorchMLPEncoder):
    def _forward(self, inputs: dict, **kwargs) -> dict:
        return {ENCODER_OUT: self.net(torch.cat([inputs[Columns.OBS], inputs[Columns.ACTIONS]], dim=-1))}


@dataclasses.dataclass
class ConcatQEncoderConfig(MLPEncoderConfig):
    def build(self, framework: str = "torch") -> ConcatQEncoder:
        return ConcatQEncoder(self)


# The module's `model_config` key that layer-normalizes the critics' layers (`CQLParams.critic_layer_norm`).
CRITIC_LAYER_NORM = "critic_layer_norm"


class ConcatQCatalog(SACCatalog):
    def __init__(self, observation_space, action_space, model_config_dict, *args, **kwargs):
        super().__init__(observation_space, action_space, model_config_dict, *args, **kwargs)
        # Absent from IQL's modules and from checkpoints made before it was a choice.
        self.critic_layer_norm = bool(model_config_dict.get(CRITIC_LAYER_NORM, False))

    @private_hook("SACCatalog._build_qf_encoder_continuous")
    def _build_qf_encoder_continuous(self, framework: str) -> ConcatQEncoder:
        # The policy's observation encoder (layers, activation, initializers), widened to take the action too.
        obs_encoder = encoder_config(self)
        self.qf_encoder_config = ConcatQEncoderConfig(
            **{f.name: getattr(obs_encoder, f.name) for f in dataclasses.fields(obs_encoder)})
        self.qf_encoder_config.input_dims = (self.observation_space.shape[0] + self.action_space.shape[0],)
        self.qf_encoder_config.hidden_layer_use_layernorm = self.critic_layer_norm
        self.qf_encoder_config.output_layer_use_layernorm = self.critic_layer_norm
        return self.qf_encoder_config.build(framework)


GRADIENT_UPDATES = "gradient_updates"


class TargetsPerUpdate:
    """Mixin, listed before LeanTorchLearner in the bases: every `target_network_update_freq` gradient updates
    (every update when 0), each target network moves `tau` of the way to its online network (1 copies it), all
    its tensors in one op (RLlib's `update_target_network` rebuilds and loads a state dict per network, a few
    milliseconds per update for IQL's four). Updates are counted across checkpoints."""

    def build(self) -> None:
        super().build()
        self._gradient_updates = 0
        self._target_moves: dict[str, int] = {}
        self._target_tensors: dict[str, tuple[list, list]] = {}

    def get_state(self, *args, **kwargs):
        return {**super().get_state(*args, **kwargs), GRADIENT_UPDATES: self._gradient_updates}

    def set_state(self, state) -> None:
        super().set_state(state)
        self._gradient_updates = state.get(GRADIENT_UPDATES, self._gradient_updates)

    def apply_gradients(self, gradients_dict) -> None:
        super().apply_gradients(gradients_dict)
        self._gradient_updates += 1
        for module_id in self.module.keys():
            config = self.config.get_config_for_module(module_id)
            if self._gradient_updates % max(config.target_network_update_freq, 1) == 0:
                self._move_targets(module_id, config.tau)
                self._target_moves[module_id] = self._target_moves.get(module_id, 0) + 1

    @torch.no_grad()
    def _move_targets(self, module_id: str, tau: float) -> None:
        if module_id not in self._target_tensors:  # the same tensors for good: optimizers and restores update them
            pairs = self.module[module_id].unwrapped().get_target_network_pairs()
            self._target_tensors[module_id] = ([tensor for _, target in pairs for tensor in target.parameters()],
                                               [tensor for main, _ in pairs for tensor in main.parameters()])
        targets, online = self._target_tensors[module_id]
        if tau == 1.0:  # an exact copy, which lerp's arithmetic would round
            for target, tensor in zip(targets, online):
                target.copy_(tensor)
        else:
            foreach_lerp_(targets, online, tau)

    def after_gradient_based_update(self, *, timesteps) -> None:
        # Continues the chain after DQNLearner's once-per-call move (above): with TorchLearner then Learner for DQN
        # and CQL; with Learner for IQL, whose TorchLearner comes before DQNLearner and only steps torch LR
        # schedulers, which our learners do not register. LeanTorchLearner's override is skipped too; its step
        # counters are logged here.
        super(DQNLearner, self).after_gradient_based_update(timesteps=timesteps)
        for module_id, moves in self._target_moves.items():
            self.metrics.log_value((module_id, NUM_TARGET_UPDATES), moves, reduce="lifetime_sum")
        self._target_moves = {}
        self._log_rows_trained()
