"""Offline DQN on RLlib's new API stack, with an optional conservative (CQL) penalty for discrete actions.

RLlib 2.60's DQN always samples env runners into a replay buffer; `offline_data` is built but never read.
`OfflineDQN` keeps DQN's RLModule (dueling heads, target network) and learner (target updates), computes
DQN's TD loss (double Q, Huber) for offline batches only, and replaces the training step with the one
BC/MARWIL/CQL use: batches from `self.offline_data`, no env runners. n-step returns are summed from each
episode's rows (`NStepData`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from ray.rllib.algorithms.dqn import DQN, DQNConfig
from ray.rllib.algorithms.dqn.dqn_learner import (
    QF_LOSS_KEY,
    QF_MAX_KEY,
    QF_MEAN_KEY,
    QF_MIN_KEY,
    QF_NEXT_PREDS,
    QF_PREDS,
    QF_TARGET_NEXT_PREDS,
    TD_ERROR_MEAN_KEY,
)
from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import DefaultDQNTorchRLModule
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.core.models.base import ENCODER_OUT
from ray.rllib.utils.metrics import (
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    OFFLINE_SAMPLING_TIMER,
    TIMERS,
)

from training.algorithms.batch_columns import N_STEP
from training.algorithms.lean_learner import LeanTorchLearner
from training.algorithms.rllib_internals import mark_offline, private_hook
from training.algorithms.shared import TargetsPerUpdate, WithoutEnvRunners

CQL_PENALTY = "cql_penalty"


class OfflineDQNConfig(DQNConfig):
    """DQNConfig for training from `offline_data` only; `cql_alpha > 0` adds the conservative penalty.

    `target_network_update_freq` counts gradient updates (online DQN counts sampled env steps).
    """

    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or OfflineDQN)
        mark_offline(self)
        self.cql_alpha = 0.0
        # One training_step per iteration, as in BC/MARWIL. DQN's default repeats it until env runners have
        # sampled 1000 steps, which offline never happens.
        self.min_sample_timesteps_per_iteration = 0

    def training(self, *, cql_alpha: float | None = None, **kwargs) -> OfflineDQNConfig:
        super().training(**kwargs)
        if cql_alpha is not None:
            self.cql_alpha = cql_alpha
        return self

    def get_default_learner_class(self):
        return OfflineDQNTorchLearner

    def get_default_rl_module_spec(self):
        spec = super().get_default_rl_module_spec()
        spec.module_class = OfflineDQNTorchRLModule
        return spec


class OfflineDQNTorchRLModule(DefaultDQNTorchRLModule):
    """RLlib's DQN module, with two costs of its training forward pass taken out; the loss is the same.

    - The online Q-values of the next observations (by which double Q picks the bootstrap action) are
      computed without gradients. RLlib computes them in one pass with the current observations, so every
      backward pass covered twice the batch.
    - Dueling heads centre the advantages with a plain mean. RLlib's is nan-aware, for action masks that set
      advantages to -inf; our datasets have no masks, and its nan_to_num and nanmean add ops to each of an
      update's passes.
    """

    @private_hook("DefaultDQNTorchRLModule._qf_forward_helper")
    def _qf_forward_helper(self, batch, encoder, head):
        if not self.uses_dueling or self.num_atoms > 1:
            return super()._qf_forward_helper(batch, encoder, head)
        features = encoder(batch)[ENCODER_OUT]
        advantages = head["af"](features)
        return {QF_PREDS: head["vf"](features) + advantages - advantages.mean(dim=-1, keepdim=True)}

    def _forward_train(self, batch):
        if not self.uses_double_q:
            return super()._forward_train(batch)
        next_obs = {Columns.OBS: batch[Columns.NEXT_OBS]}
        with torch.no_grad():
            next_q = self.compute_q_values(next_obs)[QF_PREDS]
        return {
            QF_PREDS: self.compute_q_values({Columns.OBS: batch[Columns.OBS]})[QF_PREDS],
            QF_NEXT_PREDS: next_q,
            QF_TARGET_NEXT_PREDS: self.forward_target(next_obs)[QF_PREDS],
        }


class OfflineDQN(WithoutEnvRunners, DQN):
    @classmethod
    def get_default_config(cls) -> OfflineDQNConfig:
        return OfflineDQNConfig()

    def training_step(self) -> None:
        updates = self.config.dataset_num_iters_per_learner
        with self.metrics.log_time((TIMERS, OFFLINE_SAMPLING_TIMER)):
            iterators = self.offline_data.sample(num_samples=self.config.train_batch_size_per_learner,
                                                 num_shards=self.config.num_learners, return_iterator=True)
            # Offline, the steps "sampled" are the steps trained on.
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


class OfflineDQNTorchLearner(TargetsPerUpdate, LeanTorchLearner, DQNTorchLearner):
    """DQN's loss on one-step transitions, plus alpha * E[logsumexp_a Q(s, a) - Q(s, a_data)] (CQL(H)).

    Target networks sync every `target_network_update_freq` gradient updates (shared.py).
    """

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        """RLlib's DQN loss for what offline training uses of it: the TD loss of one Q-value per row, to a
        double-Q (or target-max) n-step target, with RLlib's metric names. RLlib's also serves prioritized
        replay (importance weights, per-sample TD errors), distributional Q and masked actions, which offline
        DQN has none of; their ops and metrics are left out."""
        q_values = fwd_out[QF_PREDS]
        q_taken = q_values.gather(-1, batch[Columns.ACTIONS].long().unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            chooser = fwd_out[QF_NEXT_PREDS] if config.double_q else fwd_out[QF_TARGET_NEXT_PREDS]
            next_q = fwd_out[QF_TARGET_NEXT_PREDS].gather(-1, chooser.argmax(-1, keepdim=True)).squeeze(-1)
            not_terminated = 1.0 - batch[Columns.TERMINATEDS].float()
            target = batch[Columns.REWARDS] + config.gamma ** batch[N_STEP] * not_terminated * next_q
        loss_fn = F.huber_loss if config.td_error_loss_fn == "huber" else F.mse_loss
        loss = loss_fn(q_taken, target)
        taken = q_taken.detach()
        self.metrics.log_dict({QF_LOSS_KEY: loss, QF_MEAN_KEY: taken.mean(), QF_MAX_KEY: taken.max(),
                               QF_MIN_KEY: taken.min(), TD_ERROR_MEAN_KEY: (taken - target).abs().mean()},
                              key=module_id, window=1)
        if config.cql_alpha > 0:
            penalty = (torch.logsumexp(q_values, dim=-1) - q_taken).mean()
            self.metrics.log_value((module_id, CQL_PENALTY), penalty, window=1)
            loss = loss + config.cql_alpha * penalty
        return loss
