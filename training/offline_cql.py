"""RLlib's CQL (SAC-based, continuous actions), made to train from `offline_data` alone.

RLlib 2.60's CQLConfig still counts as online, so CQL builds env runners (and fails without an env), and
its setup asks them whether the module is stateful. `OfflineCQL` builds none, like BC and MARWIL.

Its tanh-squashed policy acts in [-1, 1]. Online, RLlib's env runners rescale those actions to the env's
bounds; its offline pipeline does not, so `UnitActionsData` rescales the dataset's actions (kept in the
env's bounds, where users expect them) to [-1, 1]. `collectors.policies.ModulePolicy` maps back.
"""

from __future__ import annotations

from ray.rllib.algorithms.cql import CQL, CQLConfig
from ray.rllib.algorithms.cql.torch.cql_torch_learner import CQLTorchLearner

from training.lean_learner import LeanTorchLearner
from training.offline_dqn import WithoutEnvRunners
from training.train_batches import UnitActionsData


class OfflineCQLTorchLearner(LeanTorchLearner, CQLTorchLearner):
    pass


class OfflineCQLConfig(CQLConfig):
    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or OfflineCQL)
        self._is_online = False
        self.offline_data_class = UnitActionsData

    def get_default_learner_class(self):
        return OfflineCQLTorchLearner


class OfflineCQL(WithoutEnvRunners, CQL):
    @classmethod
    def get_default_config(cls) -> OfflineCQLConfig:
        return OfflineCQLConfig()
