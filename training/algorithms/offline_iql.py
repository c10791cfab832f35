"""Implicit Q-learning (Kostrikov et al., 2021) on RLlib's IQL, for continuous and discrete actions.

IQL never asks the Q-function about an action the data does not take: V(s) is fitted as an upper expectile of
Q(s, a) over the data's actions, Q(s, a) regresses onto r + gamma * V(s'), and the policy clones the data's actions
weighted by exp(beta * (Q(s, a) - V(s))).

RLlib 2.60's IQL (MARWIL's training step, SAC's networks plus a value network) trains offline with no env runners
already. What changes here:
- Discrete actions. RLlib's module refuses them, though SAC's networks it builds on serve both kinds: for a
  Discrete space the Q-networks give Q(s, .) for every action and the policy head logits. IQL reads Q at the
  data's action, so the same losses apply.
- The training pass computes only what IQL's losses read (`OfflineIQLTorchRLModule`). RLlib's runs SAC's first:
  actions resampled from the policy at s and s', and their Q-values, which SAC's and CQL's losses need and IQL's
  never reads.
- One backward pass for the three losses, where RLlib's learner makes one per optimizer (four, keeping the graph
  between them). They touch disjoint networks (the targets are computed without gradients, the advantage weights
  are detached), so each network gets the same gradients.
- Target critics follow the critics by Polyak averaging at every gradient update, as in the paper
  (shared.py).
- beta is the paper's inverse temperature (3 on its locomotion tasks, whose rewards it rescales; 1 here, as
  IQLParams'). RLlib's IQL takes it as MARWIL's `beta`, which MARWILConfig.validate caps at 1, so it travels as
  `advantage_beta`.
- Over Box actions the policy is SAC's tanh-squashed Gaussian, or with `bounded_mean_gaussian` the paper's own
  (common/action_distributions.py).
- Q(s, a) for continuous actions is one MLP over the observation and action concatenated (`ConcatQCatalog`), as
  in the paper and d3rlpy, and actions are rescaled to the tanh policy's [-1, 1] (offline_cql.py), kept 1 % inside
  it (registry.py's `SQUASHED_ACTION_MARGIN`).
"""

from __future__ import annotations

import gymnasium as gym
import torch
import torch.nn.functional as F
from ray.rllib.algorithms.dqn.dqn_learner import QF_LOSS_KEY, QF_PREDS
from ray.rllib.algorithms.iql import IQLConfig
from ray.rllib.algorithms.iql.iql_learner import QF_TARGET_PREDS, VF_LOSS, VF_PREDS_NEXT
from ray.rllib.algorithms.iql.torch.default_iql_torch_rl_module import DefaultIQLTorchRLModule
from ray.rllib.algorithms.iql.torch.iql_torch_learner import IQLTorchLearner
from ray.rllib.algorithms.sac.sac_learner import QF_TWIN_PREDS
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import POLICY_LOSS_KEY
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.models.base import ENCODER_OUT
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from common.action_distributions import TorchBoundedMeanGaussian
from training.algorithms.lean_learner import LeanTorchLearner
from training.algorithms.rllib_internals import q_network_outputs
from training.algorithms.shared import ConcatQCatalog, TargetsPerUpdate

# The paper's cap on the advantage weights, which keeps one row from dominating a batch.
MAX_ADVANTAGE_WEIGHT = 100.0
ADVANTAGE_WEIGHT_MEAN = "advantage_weight_mean"
# The fraction of the batch the weighted cloning learns from, (sum w)^2 / (n sum w^2): near 1 when the weights are
# even, near 1/n when one row takes them all (beta too high for the noise in Q - V).
ADVANTAGE_WEIGHT_ESS = "advantage_weight_ess"


class OfflineIQLConfig(IQLConfig):
    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class)
        self.advantage_beta = 1.0
        self.bounded_mean_gaussian = False

    def training(self, *, advantage_beta: float | None = None, bounded_mean_gaussian: bool | None = None,
                 **kwargs) -> OfflineIQLConfig:
        super().training(**kwargs)
        if advantage_beta is not None:
            self.advantage_beta = advantage_beta
        if bounded_mean_gaussian is not None:
            self.bounded_mean_gaussian = bounded_mean_gaussian
        return self

    def get_default_learner_class(self):
        return OfflineIQLTorchLearner

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=OfflineIQLTorchRLModule,
                            catalog_class=BoundedMeanGaussianCatalog if self.bounded_mean_gaussian else ConcatQCatalog)


class BoundedMeanGaussianCatalog(ConcatQCatalog):
    """IQL's networks with the paper's policy over Box actions: a Gaussian with a tanh-bounded mean and a deviation
    that is one free parameter per action dimension, not an output of the network."""

    def __init__(self, observation_space, action_space, model_config_dict, *args, **kwargs):
        super().__init__(observation_space, action_space, {**model_config_dict, "free_log_std": True}, *args, **kwargs)

    def get_action_dist_cls(self, framework: str):
        if isinstance(self.action_space, gym.spaces.Box):
            return TorchBoundedMeanGaussian
        return super().get_action_dist_cls(framework)


class OfflineIQLTorchRLModule(DefaultIQLTorchRLModule):
    def _forward_train(self, batch: dict) -> dict:
        obs, taken = {Columns.OBS: batch[Columns.OBS]}, {Columns.OBS: batch[Columns.OBS],
                                                         Columns.ACTIONS: batch[Columns.ACTIONS]}
        out = {
            Columns.ACTION_DIST_INPUTS: self.pi(self.pi_encoder(obs)[ENCODER_OUT]),
            QF_PREDS: self._q_of_taken(taken, self.qf_encoder, self.qf),
            Columns.VF_PREDS: self.compute_values(obs),
        }
        if self.twin_q:
            out[QF_TWIN_PREDS] = self._q_of_taken(taken, self.qf_twin_encoder, self.qf_twin)
        with torch.no_grad():
            target = self._q_of_taken(taken, self.target_qf_encoder, self.target_qf)
            if self.twin_q:
                target = torch.min(target, self._q_of_taken(taken, self.target_qf_twin_encoder, self.target_qf_twin))
            out[QF_TARGET_PREDS] = target
            out[VF_PREDS_NEXT] = self.compute_values({Columns.OBS: batch[Columns.NEXT_OBS]})
        return out

    def _q_of_taken(self, batch: dict, encoder, head) -> torch.Tensor:
        """Q(s, a) at the batch's actions: one output per row for Box actions, picked from every action's for
        Discrete."""
        q = q_network_outputs(self, batch, encoder, head)
        if isinstance(self.action_space, gym.spaces.Discrete):
            return q.gather(-1, batch[Columns.ACTIONS].long().unsqueeze(-1)).squeeze(-1)
        return q.squeeze(-1)


class OfflineIQLTorchLearner(TargetsPerUpdate, LeanTorchLearner, IQLTorchLearner):
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        module = self.module[module_id].unwrapped()
        advantages = fwd_out[QF_TARGET_PREDS] - fwd_out[Columns.VF_PREDS]
        value_loss = (torch.where(advantages > 0, config.expectile, 1.0 - config.expectile)
                      * advantages.square()).mean()

        weights = torch.exp(config.advantage_beta * advantages.detach()).clamp(max=MAX_ADVANTAGE_WEIGHT)
        action_dist = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        policy_loss = -(weights * action_dist.logp(batch[Columns.ACTIONS])).mean()

        not_terminated = 1.0 - batch[Columns.TERMINATEDS].float()
        td_target = batch[Columns.REWARDS] + config.gamma * not_terminated * fwd_out[VF_PREDS_NEXT]
        q_loss = F.mse_loss(fwd_out[QF_PREDS], td_target)
        if config.twin_q:
            q_loss = q_loss + F.mse_loss(fwd_out[QF_TWIN_PREDS], td_target)

        self.metrics.log_dict({POLICY_LOSS_KEY: policy_loss, QF_LOSS_KEY: q_loss, VF_LOSS: value_loss,
                               ADVANTAGE_WEIGHT_MEAN: weights.mean(),
                               ADVANTAGE_WEIGHT_ESS: weights.sum().square() / (len(weights) * weights.square().sum())},
                              key=module_id, window=1)
        return value_loss + policy_loss + q_loss

    def compute_gradients(self, loss_per_module, **kwargs):
        return TorchLearner.compute_gradients(self, loss_per_module, **kwargs)
