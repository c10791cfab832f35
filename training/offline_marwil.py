"""RLlib's MARWIL, with advantages measured from the dataset's discounted returns-to-go, and BC.

RLlib 2.60's offline MARWIL makes every row a one-step episode, so its value targets are r + gamma * V(s')
with V frozen at initialisation (see training/train_batches.py). `ReturnsData` computes the Monte Carlo
returns MARWIL is defined with, from `returns_read_rows` rows at a time, bootstrapped with the current value
function where the env's time limit cut an episode. BC is RLlib's MARWIL with beta = 0 and no value function;
it reads plain transitions.
"""

from __future__ import annotations

import torch
from ray.rllib.algorithms.bc import BCConfig
from ray.rllib.algorithms.marwil import MARWILConfig
from ray.rllib.algorithms.marwil.torch.marwil_torch_learner import MARWILTorchLearner

from training.batch_columns import BOOTSTRAP_DISCOUNT, BOOTSTRAP_OBS, OBS, VALUE_TARGETS
from training.lean_learner import LeanTorchLearner
from training.train_batches import ReturnsData, TransitionsData


class OfflineMARWILTorchLearner(LeanTorchLearner, MARWILTorchLearner):
    def compute_loss_for_module(self, *, module_id, config=None, batch, fwd_out):
        if BOOTSTRAP_OBS in batch:  # MARWIL (BC has no value function): bootstrap at the env's time limit
            with torch.no_grad():
                values = self.module[module_id].unwrapped().compute_values({OBS: batch[BOOTSTRAP_OBS]})
            batch = {**batch, VALUE_TARGETS: batch[VALUE_TARGETS] + batch[BOOTSTRAP_DISCOUNT] * values}
        return super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)


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
