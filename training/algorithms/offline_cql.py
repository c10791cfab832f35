"""RLlib's CQL (SAC-based, continuous actions), made to train from `offline_data` alone.

RLlib 2.60's CQLConfig still counts as online, so CQL builds env runners (and fails without an env), and
its setup asks them whether the module is stateful. `OfflineCQL` builds none, like BC and MARWIL.

Its tanh-squashed policy acts in [-1, 1]. Online, RLlib's env runners rescale those actions to the env's
bounds; its offline pipeline does not, so its batch function (`with_unit_actions`) rescales the dataset's
actions (kept in the env's bounds, where users expect them) to [-1, 1]. `common.trained_policy.ModulePolicy` maps back.

RLlib's SAC catalog gives Q(s, a) a multi-stream network: one MLP for the observation, one for the action,
then a 2-layer tanh fusion net with skip connections, several times the multiply-adds of the network the
CQL paper and d3rlpy use, which CQL evaluates on 10 sampled actions per row (docs/algorithms.md).
`ConcatQCatalog` builds the paper's Q: one MLP of `hidden_layers` over the observation and action concatenated.
"""

from __future__ import annotations

import dataclasses

import torch
from ray.rllib.algorithms.cql import CQL, CQLConfig
from ray.rllib.algorithms.cql.torch.cql_torch_learner import CQLTorchLearner
from ray.rllib.algorithms.cql.torch.default_cql_torch_rl_module import DefaultCQLTorchRLModule
from ray.rllib.algorithms.sac.sac_catalog import SACCatalog
from ray.rllib.core.columns import Columns
from ray.rllib.core.models.base import ENCODER_OUT
from ray.rllib.core.models.configs import MLPEncoderConfig
from ray.rllib.core.models.torch.encoder import TorchMLPEncoder
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from training.algorithms.lean_learner import LeanTorchLearner
from training.algorithms.offline_dqn import WithoutEnvRunners
from training.algorithms.rllib_internals import encoder_config, mark_offline, private_hook
from training.algorithms.target_networks import TargetsPerUpdate


class ConcatQEncoder(TorchMLPEncoder):
    def _forward(self, inputs: dict, **kwargs) -> dict:
        return {ENCODER_OUT: self.net(torch.cat([inputs[Columns.OBS], inputs[Columns.ACTIONS]], dim=-1))}


@dataclasses.dataclass
class ConcatQEncoderConfig(MLPEncoderConfig):
    def build(self, framework: str = "torch") -> ConcatQEncoder:
        return ConcatQEncoder(self)


class ConcatQCatalog(SACCatalog):
    @private_hook("SACCatalog._build_qf_encoder_continuous")
    def _build_qf_encoder_continuous(self, framework: str) -> ConcatQEncoder:
        # The policy's observation encoder (layers, activation, initializers), widened to take the action too.
        obs_encoder = encoder_config(self)
        self.qf_encoder_config = ConcatQEncoderConfig(
            **{f.name: getattr(obs_encoder, f.name) for f in dataclasses.fields(obs_encoder)})
        self.qf_encoder_config.input_dims = (self.observation_space.shape[0] + self.action_space.shape[0],)
        return self.qf_encoder_config.build(framework)


class OfflineCQLTorchLearner(TargetsPerUpdate, LeanTorchLearner, CQLTorchLearner):
    """Target critics follow by Polyak averaging at every gradient update (target_networks.py)."""


class OfflineCQLConfig(CQLConfig):
    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or OfflineCQL)
        mark_offline(self)

    def get_default_learner_class(self):
        return OfflineCQLTorchLearner

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=DefaultCQLTorchRLModule, catalog_class=ConcatQCatalog)


class OfflineCQL(WithoutEnvRunners, CQL):
    @classmethod
    def get_default_config(cls) -> OfflineCQLConfig:
        return OfflineCQLConfig()
