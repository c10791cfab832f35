"""Per-update costs of RLlib's TorchLearner that small networks on CPU feel, taken out for our learners.

- RLlib checks every gradient tensor for nan/inf twice per update, each check a separate op and a sync
  (`TorchLearner.apply_gradients`). `LeanTorchLearner` makes one check, of the stacked sums of all tensors
  (nan and inf survive a sum): one op and one sync per update, where RLlib makes two per tensor
  (docs/algorithms.md). An update with a non-finite gradient is skipped (RLlib would zero those entries and
  step, which corrupts Adam's moments) and counted. It relies on the config's `torch_skip_nan_gradients=True`,
  which in RLlib 2.60 turns both of RLlib's checks off (training/algorithms/registry.py sets it).
- Denormal floats are flushed to zero. As a cloned policy grows confident its gradients, and Adam's
  second moments, fall into the denormal range, where CPU float math is many times slower (measured in
  docs/algorithms.md).
- Clipping by global norm (DQN's default, at 40) takes the norms of all gradient tensors in one foreach op
  and scales them in another: two ops in all, against RLlib's norm, nan_to_num and multiply per tensor.
  The result is the same.
- Adam runs fused: one call updates every parameter tensor, where torch's default on CPU makes about ten
  calls per tensor, each through Python and the dispatcher (see benchmarks/throughput.md, "Training").
  The math is the same.
- Discrete actions' log-probabilities come from one `log_softmax` (`LogSoftmaxCategorical`). torch's
  Categorical normalises its logits with `logsumexp` as it is built, which guards against infinities with
  about ten ops forward and as many backward, a measurable share of a small network's update.
- RLlib's eight step counters are logged once per `update` call, for all its minibatches, instead of once per
  minibatch (`Learner._log_steps_trained_metrics`).
"""

from __future__ import annotations

import functools
import logging

import torch
from ray.rllib.core.distribution.distribution import Distribution
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.utils import torch_utils
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    MODULE_TRAIN_BATCH_SIZE_MEAN,
    NUM_ENV_STEPS_TRAINED,
    NUM_ENV_STEPS_TRAINED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    WEIGHTS_SEQ_NO,
)

from training.algorithms.rllib_internals import (
    categorical_without_init,
    foreach_mul_,
    foreach_norm,
    private_hook,
    torch_categorical,
    weights_seq_no,
)

logger = logging.getLogger(__name__)

SKIPPED_UPDATES = "nonfinite_updates_skipped"


class LeanTorchLearner:
    """Mixin, listed before RLlib's TorchLearner subclass in the bases."""

    def build(self) -> None:
        super().build()
        torch.set_flush_denormal(True)
        for module_id in self.module.keys():
            for _, optimizer in self.get_optimizers_for_module(module_id):
                if isinstance(optimizer, torch.optim.Adam):  # RLlib's learners for our algorithms all build Adam
                    for group in optimizer.param_groups:
                        group.update(foreach=None, fused=True)
        for module in self.module.values():
            module = module.unwrapped()
            if module.get_train_action_dist_cls() is TorchCategorical:  # the one BC's and MARWIL's losses read
                module.action_dist_cls = LogSoftmaxCategorical
        self._minibatch_rows: dict[str, list[int]] = {}
        self._env_steps_trained = 0

    @private_hook("Learner._log_steps_trained_metrics")
    def _log_steps_trained_metrics(self, batch) -> None:
        """Counts a minibatch's rows, which `_log_rows_trained` logs once the `update` call is done."""
        for module_id, module_batch in batch.policy_batches.items():
            self._minibatch_rows.setdefault(module_id, []).append(len(module_batch))
        self._env_steps_trained += batch.env_steps()

    def after_gradient_based_update(self, *, timesteps) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        self._log_rows_trained()

    def _log_rows_trained(self) -> None:
        """The metrics of RLlib's `_log_steps_trained_metrics` for all minibatches of an `update` call: the
        same sums, and the minibatches' mean size as one value for the running mean."""
        log = self.metrics.log_value
        for module_id, sizes in self._minibatch_rows.items():
            rows = sum(sizes)
            log((module_id, WEIGHTS_SEQ_NO), weights_seq_no(self), window=1)
            log((module_id, MODULE_TRAIN_BATCH_SIZE_MEAN), rows / len(sizes), reduce="mean")
            log((module_id, NUM_MODULE_STEPS_TRAINED), rows, reduce="sum")
            log((module_id, NUM_MODULE_STEPS_TRAINED_LIFETIME), rows, reduce="lifetime_sum", with_throughput=True)
            log((ALL_MODULES, NUM_MODULE_STEPS_TRAINED), rows, reduce="sum", with_throughput=True)
            log((ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), rows, reduce="lifetime_sum", with_throughput=True)
        if self._minibatch_rows:
            log((ALL_MODULES, NUM_ENV_STEPS_TRAINED), self._env_steps_trained, reduce="sum", with_throughput=True)
            log((ALL_MODULES, NUM_ENV_STEPS_TRAINED_LIFETIME), self._env_steps_trained, reduce="lifetime_sum",
                with_throughput=True)
        self._minibatch_rows, self._env_steps_trained = {}, 0

    @staticmethod
    @private_hook("TorchLearner._get_clip_function")
    def _get_clip_function():
        return clip_gradients

    def apply_gradients(self, gradients_dict) -> None:
        sums = [gradient.sum() for gradient in gradients_dict.values() if gradient is not None]
        if not sums or torch.stack(sums).isfinite().all():
            super().apply_gradients(gradients_dict)
            return
        logger.warning("Skipping an update whose gradients contain nan or inf.")
        for module_id in self.module.keys():
            self.metrics.log_value((module_id, SKIPPED_UPDATES), 1, reduce="lifetime_sum")


def clip_gradients(gradients_dict, *, grad_clip: float | None = None, grad_clip_by: str = "value"):
    """RLlib's `clip_gradients`, with its global-norm mode in foreach ops; returns the global norm there."""
    if grad_clip is None or grad_clip_by != "global_norm":
        return torch_utils.clip_gradients(gradients_dict, grad_clip=grad_clip, grad_clip_by=grad_clip_by)
    gradients = [gradient for gradient in gradients_dict.values() if gradient is not None]
    if not gradients:
        return torch.tensor(0.0)
    # As RLlib: an infinite norm counts as 1e9, and gradients only ever shrink.
    total_norm = torch.linalg.vector_norm(torch.stack(foreach_norm(gradients))).nan_to_num(neginf=-1e9, posinf=1e9)
    foreach_mul_(gradients, torch.clamp(grad_clip / (total_norm + 1e-6), max=1.0))
    return total_norm


class LogSoftmaxCategorical(TorchCategorical):
    """RLlib's categorical distribution, with `logp` from one `log_softmax`; torch's Categorical, which
    normalises its logits with `logsumexp` as it is built, is built only for the methods that need it
    (sampling, entropy, KL)."""

    def __init__(self, logits: torch.Tensor | None = None, probs: torch.Tensor | None = None):
        if logits is None:
            super().__init__(probs=probs)
            return
        Distribution.__init__(self)
        categorical_without_init(self, logits)

    @functools.cached_property
    @private_hook("TorchCategorical._dist")
    def _dist(self) -> torch.distributions.Categorical:
        return torch_categorical(self, self.logits)

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        if self.logits is None:
            return super().logp(value)
        return torch.log_softmax(self.logits, dim=-1).gather(-1, value.long().unsqueeze(-1)).squeeze(-1)
