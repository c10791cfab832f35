"""Offline DQN on RLlib's new API stack, with an optional conservative (CQL) penalty for discrete actions.

RLlib 2.60's DQN always samples env runners into a replay buffer; `offline_data` is built but never read.
`OfflineDQN` keeps DQN's RLModule (dueling heads, target network) and learner (double Q, Huber TD loss,
target updates) and replaces the training step with the one BC/MARWIL/CQL use: batches from
`self.offline_data`, no env runners. Rows are one-step transitions, so n-step returns are 1-step.
"""

from __future__ import annotations

import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.dqn import DQN, DQNConfig
from ray.rllib.algorithms.dqn.dqn_learner import QF_PREDS
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.utils.metrics import (
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    OFFLINE_SAMPLING_TIMER,
    TIMERS,
)

CQL_PENALTY = "cql_penalty"


class OfflineDQNConfig(DQNConfig):
    """DQNConfig for training from `offline_data` only; `cql_alpha > 0` adds the conservative penalty."""

    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or OfflineDQN)
        self._is_online = False
        self.cql_alpha = 0.0
        self.n_step = 1
        # The final batch of a pass over the data is smaller; DQN's per-sample TD-error stats need equal sizes.
        self.iter_batches_kwargs = {"drop_last": True}

    def training(self, *, cql_alpha: float | None = None, **kwargs) -> "OfflineDQNConfig":
        super().training(**kwargs)
        if cql_alpha is not None:
            self.cql_alpha = cql_alpha
        return self

    def get_default_learner_class(self):
        return OfflineDQNTorchLearner

    def build_learner_connector(self, input_observation_space, input_action_space, device=None):
        """Offline, this pipeline runs in the OfflinePreLearner, so it must add NEXT_OBS itself (online DQN's
        learner adds it to its own pipeline, which offline batches skip)."""
        from ray.rllib.connectors.common import AddObservationsFromEpisodesToBatch
        from ray.rllib.connectors.learner import AddNextObservationsFromEpisodesToTrainBatch

        pipeline = super().build_learner_connector(input_observation_space=input_observation_space,
                                                   input_action_space=input_action_space, device=device)
        pipeline.insert_after(AddObservationsFromEpisodesToBatch, AddNextObservationsFromEpisodesToTrainBatch())
        return pipeline


class OfflineDQN(DQN):
    @classmethod
    def get_default_config(cls) -> OfflineDQNConfig:
        return OfflineDQNConfig()

    def setup(self, config) -> None:
        # DQN.setup asks env runners whether the module is stateful; offline there are none.
        Algorithm.setup(self, config)
        self._module_is_stateful = False

    def training_step(self) -> None:
        updates = self.config.dataset_num_iters_per_learner
        with self.metrics.log_time((TIMERS, OFFLINE_SAMPLING_TIMER)):
            iterators = self.offline_data.sample(num_samples=self.config.train_batch_size_per_learner,
                                                 num_shards=self.config.num_learners, return_iterator=True)
            # DQN schedules target-network updates by sampled steps; offline, that is the steps trained on.
            self.metrics.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME,
                                   self.config.train_batch_size_per_learner * updates, reduce="lifetime_sum")
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            results = self.learner_group.update(
                training_data=TrainingData(data_iterators=iterators),
                minibatch_size=self.config.train_batch_size_per_learner,
                num_iters=updates,
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(NUM_ENV_STEPS_SAMPLED_LIFETIME)},
                **self.offline_data.iter_batches_kwargs,
            )
            self.metrics.aggregate(results, key=LEARNER_RESULTS)


class OfflineDQNTorchLearner(DQNTorchLearner):
    """DQN's loss on one-step transitions, plus alpha * E[logsumexp_a Q(s, a) - Q(s, a_data)] (CQL(H))."""

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        rewards = batch[Columns.REWARDS]
        # What the replay buffer would add: the step count of each return, and uniform importance weights.
        batch["n_step"] = torch.ones_like(rewards)
        batch["weights"] = torch.ones_like(rewards)
        loss = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        if config.cql_alpha > 0:
            q_all = fwd_out[QF_PREDS]
            q_data = q_all.gather(-1, batch[Columns.ACTIONS].long().unsqueeze(-1)).squeeze(-1)
            penalty = (torch.logsumexp(q_all, dim=-1) - q_data).mean()
            self.metrics.log_value((module_id, CQL_PENALTY), penalty, window=1)
            loss = loss + config.cql_alpha * penalty
        return loss
