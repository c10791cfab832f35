"""RLlib's MARWIL, with advantages measured from the dataset's discounted returns-to-go, and BC.

RLlib 2.60's offline MARWIL makes every row a one-step episode, so its value targets are r + gamma * V(s')
with V frozen at initialisation (see train_batches.py). Its batch function (`with_returns`) computes the Monte
Carlo returns MARWIL is defined with, from `returns_read_rows` rows at a time, bootstrapped with the current
value function where the env's time limit or the end of a read cut an episode. BC is RLlib's MARWIL with beta = 0
and no value function; it reads plain transitions, and its loss is computed without the MARWIL terms that beta = 0
leaves as no-ops. Over Box actions its policy is RLlib's diagonal Gaussian, SAC's tanh-squashed one, or d3rlpy's
deterministic tanh(mu) fitted by squared error (`BCParams.action_distribution`).

MARWIL weighs each action by exp(beta * A / c), with c^2 a running mean of squared advantages. RLlib starts
c^2 at 100 whatever the rewards' scale; on LunarLander's returns-to-go the first batches' weights went to a
handful of rows until c^2 caught up (benchmarks/quality.md, "MARWIL's advantage normalizer"). Here c^2 starts
at the first batch's mean squared advantage, and is checkpointed (RLlib 2.60 leaves it out of the learner's state, so
a resumed run started it again).
"""

from __future__ import annotations

import gymnasium as gym
import torch
from ray.rllib.algorithms.bc import BCConfig
from ray.rllib.algorithms.bc.bc_catalog import BCCatalog
from ray.rllib.algorithms.marwil import MARWILConfig
from ray.rllib.algorithms.marwil.torch.marwil_torch_learner import MARWILTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchSquashedGaussian
from ray.rllib.core.learner.learner import POLICY_LOSS_KEY
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from common.action_distributions import TorchTanhDeterministic
from training.algorithms.batch_columns import BOOTSTRAP_DISCOUNT, BOOTSTRAP_OBS, OBS, VALUE_TARGETS
from training.algorithms.lean_learner import LeanTorchLearner
from training.algorithms.rllib_internals import squared_advantage_norms


# The key in the learner's state of c^2, by module.
SQUARED_ADVANTAGE_NORMS = "squared_advantage_norms"


class OfflineMARWILTorchLearner(LeanTorchLearner, MARWILTorchLearner):
    def get_state(self, *args, **kwargs):
        return {**super().get_state(*args, **kwargs),
                SQUARED_ADVANTAGE_NORMS: {key: norm.item() for key, norm in squared_advantage_norms(self).items()}}

    def set_state(self, state) -> None:
        super().set_state(state)
        for module_id, value in state.get(SQUARED_ADVANTAGE_NORMS, {}).items():
            squared_advantage_norms(self)[module_id] = torch.tensor(value, device=self.device)

    def compute_loss_for_module(self, *, module_id, config=None, batch, fwd_out):
        # Bootstrapped with the current value function where a run of an episode's steps does not end it.
        with torch.no_grad():
            values = self.module[module_id].unwrapped().compute_values({OBS: batch[BOOTSTRAP_OBS]})
        batch = {**batch, VALUE_TARGETS: batch[VALUE_TARGETS] + batch[BOOTSTRAP_DISCOUNT] * values}
        norms = squared_advantage_norms(self)
        if module_id not in norms:
            norms[module_id] = self._squared_advantages(module_id, batch)
        return super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)

    def _squared_advantages(self, module_id, batch) -> torch.Tensor:
        """The batch's mean squared advantage under the current value function."""
        with torch.no_grad():
            values = self.module[module_id].unwrapped().compute_values({OBS: batch[OBS]})
        return (batch[VALUE_TARGETS] - values).square().mean()


class OfflineBCTorchLearner(LeanTorchLearner, MARWILTorchLearner):
    """BC's loss: the negative log-likelihood of the data's actions (RLlib's MARWIL loss at beta = 0 is the same,
    after multiplying by one and adding zeros, each an autograd node), or for a deterministic policy the mean
    squared error of its actions."""

    def compute_loss_for_module(self, *, module_id, config=None, batch, fwd_out):
        module = self.module[module_id].unwrapped()
        action_dist = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        if isinstance(action_dist, TorchTanhDeterministic):
            loss = (action_dist.loc - batch[Columns.ACTIONS]).square().mean()
        else:
            loss = -action_dist.logp(batch[Columns.ACTIONS]).mean()
        self.metrics.log_value((module_id, POLICY_LOSS_KEY), loss, window=1)
        return loss


class OfflineMARWILConfig(MARWILConfig):
    def get_default_learner_class(self):
        return OfflineMARWILTorchLearner


class BoxDistributionBCCatalog(BCCatalog):
    """BC's networks with `box_distribution` over Box actions, which the learner fits to actions rescaled to [-1, 1]
    (registry.py) and `common/trained_policy.py` rescales back to the env's bounds."""

    box_distribution: type

    def get_action_dist_cls(self, framework: str):
        if isinstance(self.action_space, gym.spaces.Box):
            return self.box_distribution
        return super().get_action_dist_cls(framework)


class SquashedGaussianBCCatalog(BoxDistributionBCCatalog):
    box_distribution = TorchSquashedGaussian


class TanhDeterministicBCCatalog(BoxDistributionBCCatalog):
    box_distribution = TorchTanhDeterministic


class OfflineBCConfig(BCConfig):
    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class)
        self.box_catalog: type[BoxDistributionBCCatalog] | None = None  # None: RLlib's diagonal Gaussian

    def training(self, *, box_catalog: type[BoxDistributionBCCatalog] | None = None, **kwargs) -> OfflineBCConfig:
        super().training(**kwargs)
        if box_catalog is not None:
            self.box_catalog = box_catalog
        return self

    def get_default_learner_class(self):
        return OfflineBCTorchLearner

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        spec = super().get_default_rl_module_spec()
        if self.box_catalog is not None:
            spec.catalog_class = self.box_catalog
        return spec
