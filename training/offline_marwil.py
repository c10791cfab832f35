"""RLlib's MARWIL, with advantages measured from the dataset's discounted returns-to-go, and BC.

RLlib 2.60's offline MARWIL makes every row a one-step episode, so its value targets are r + gamma * V(s')
with V frozen at initialisation (see training/train_batches.py). `ReturnsData` computes the Monte Carlo
returns MARWIL is defined with, from `returns_read_rows` rows at a time. BC is RLlib's MARWIL with beta = 0
and no value function; it reads plain transitions.
"""

from __future__ import annotations

from ray.rllib.algorithms.bc import BCConfig
from ray.rllib.algorithms.marwil import MARWILConfig
from ray.rllib.algorithms.marwil.torch.marwil_torch_learner import MARWILTorchLearner

from training.lean_learner import LeanTorchLearner
from training.train_batches import ReturnsData, TransitionsData


class OfflineMARWILTorchLearner(LeanTorchLearner, MARWILTorchLearner):
    pass


class OfflineMARWILConfig(MARWILConfig):
    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class)
        self.offline_data_class = ReturnsData
        self.returns_read_rows = 65_536

    def training(self, *, returns_read_rows: int | None = None, **kwargs) -> "OfflineMARWILConfig":
        super().training(**kwargs)
        if returns_read_rows is not None:
            self.returns_read_rows = returns_read_rows
        return self

    def get_default_learner_class(self):
        return OfflineMARWILTorchLearner


class OfflineBCConfig(BCConfig):
    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class)
        self.offline_data_class = TransitionsData

    def get_default_learner_class(self):
        return OfflineMARWILTorchLearner
