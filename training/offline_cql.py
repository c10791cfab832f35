"""RLlib's CQL (SAC-based, continuous actions), made to train from `offline_data` alone.

RLlib 2.60's CQLConfig still counts as online, so CQL builds env runners (and fails without an env), and
its setup asks them whether the module is stateful. `OfflineCQL` builds none, like BC and MARWIL.

Its tanh-squashed policy acts in [-1, 1]. Online, RLlib's env runners rescale those actions to the env's
bounds; its offline pipeline does not, so `UnitActionsPreLearner` rescales the dataset's actions (kept in the
env's bounds, where users expect them) to [-1, 1]. `collectors.policies.ModulePolicy` maps back.
"""

from __future__ import annotations

import numpy as np
from ray.rllib.algorithms.cql import CQL, CQLConfig
from ray.rllib.core.columns import Columns
from ray.rllib.offline.offline_prelearner import OfflinePreLearner

from training.offline_dqn import WithoutEnvRunners


class UnitActionsPreLearner(OfflinePreLearner):
    """RLlib's OfflinePreLearner, with Box actions rescaled from the env's bounds to [-1, 1]."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        low, high = self.action_space.low, self.action_space.high
        actions = np.stack(batch[Columns.ACTIONS]).astype(np.float32)
        batch[Columns.ACTIONS] = np.clip(2.0 * (actions - low) / (high - low) - 1.0, -1.0, 1.0)
        return super().__call__(batch)


class OfflineCQLConfig(CQLConfig):
    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or OfflineCQL)
        self._is_online = False
        self.prelearner_class = UnitActionsPreLearner


class OfflineCQL(WithoutEnvRunners, CQL):
    @classmethod
    def get_default_config(cls) -> OfflineCQLConfig:
        return OfflineCQLConfig()
