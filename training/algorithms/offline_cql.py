"""RLlib's CQL (SAC-based, continuous actions), made to train from `offline_data` alone.

RLlib 2.60's CQLConfig still counts as online, so CQL builds env runners (and fails without an env), and
its setup asks them whether the module is stateful. `OfflineCQL` builds none, like BC and MARWIL.

Its tanh-squashed policy acts in [-1, 1]. Online, RLlib's env runners rescale those actions to the env's
bounds; its offline pipeline does not, so its batch function (`with_unit_actions`) rescales the dataset's
actions (kept in the env's bounds, where users expect them) to [-1, 1]. `common.trained_policy.ModulePolicy` maps back.

Its Q-network is the CQL paper's, one MLP of `hidden_layers` over the observation and action concatenated
(`ConcatQCatalog`, shared.py).
"""

from __future__ import annotations

from ray.rllib.algorithms.cql import CQL, CQLConfig
from ray.rllib.algorithms.cql.torch.cql_torch_learner import CQLTorchLearner
from ray.rllib.algorithms.cql.torch.default_cql_torch_rl_module import DefaultCQLTorchRLModule
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from training.algorithms.lean_learner import LeanTorchLearner
from training.algorithms.rllib_internals import mark_offline
from training.algorithms.shared import ConcatQCatalog, TargetsPerUpdate, WithoutEnvRunners


class OfflineCQLTorchLearner(TargetsPerUpdate, LeanTorchLearner, CQLTorchLearner):
    """Target critics follow by Polyak averaging at every gradient update (shared.py)."""


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
