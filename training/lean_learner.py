"""Per-update costs of RLlib's TorchLearner that small networks on CPU feel, taken out for our learners.

- RLlib checks every gradient tensor for nan/inf twice per update, each check a separate op and a sync
  (`TorchLearner.apply_gradients`). `LeanTorchLearner` makes one check, of the stacked sums of all tensors
  (nan and inf survive a sum): about 30 us per update for BC's network, against RLlib's 2 x 140 us. An update
  with a non-finite gradient is skipped (RLlib would zero those entries and step, which corrupts Adam's
  moments) and counted. It relies on the config's `torch_skip_nan_gradients=True`, which in RLlib 2.60
  turns both of RLlib's checks off (training/algorithms.py sets it).
- Denormal floats are flushed to zero. As a cloned policy grows confident its gradients, and Adam's
  second moments, fall into the denormal range, where CPU float math is many times slower: in a 160-iteration
  BC run on cartpole-expert, iterations 60-120 ran at 45k samples/s instead of 97k; flushed, at 80k.
- Clipping by global norm (DQN's default, at 40) takes the norms of all gradient tensors in one foreach op
  and scales them in another: about 60 us per update for DQN's network, against RLlib's 120 us for a norm,
  a nan_to_num and a multiply per tensor. The result is the same.
- Adam runs fused: one call updates every parameter tensor, where torch's default on CPU makes about ten
  calls per tensor, each through Python and the dispatcher: 1.07-1.10x samples/s for BC, MARWIL and DQN.
  The math is the same.
"""

from __future__ import annotations

import logging

import torch
from ray.rllib.utils import torch_utils

logger = logging.getLogger(__name__)

SKIPPED_UPDATES = "nonfinite_updates_skipped"


class LeanTorchLearner:
    """Mixin, listed before RLlib's TorchLearner subclass in the bases."""

    def build(self) -> None:
        super().build()
        torch.set_flush_denormal(True)
        for optimizer in self._named_optimizers.values():
            if isinstance(optimizer, torch.optim.Adam):  # all of RLlib's learners for our algorithms build Adam
                for group in optimizer.param_groups:
                    group.update(foreach=None, fused=True)

    @staticmethod
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
    total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(gradients))).nan_to_num(
        neginf=-1e9, posinf=1e9)
    torch._foreach_mul_(gradients, torch.clamp(grad_clip / (total_norm + 1e-6), max=1.0))
    return total_norm
