"""Action distributions of our own, shared by the learners that fit them (training/) and the policies that act with
them (common/trained_policy.py). RLlib's own (its diagonal and tanh-squashed Gaussians) need no home here.

Imported where torch is already in use: importing it loads RLlib.
"""

from __future__ import annotations

import torch
from ray.rllib.core.distribution.torch.torch_distribution import TorchDeterministic, TorchDiagGaussian


class TorchBoundedMeanGaussian(TorchDiagGaussian):
    """The IQL paper's actor over actions rescaled to [-1, 1] (and d3rlpy's): a Gaussian whose mean is tanh(mu), so
    its mode lies within the bounds, while its density stays the Gaussian's, unlike SAC's tanh-squashed one, whose
    log-density grows without bound towards actions at the bounds. Its inputs are [mu, log_std], as RLlib's Gaussians'
    (the policy head gives log_std as one free parameter per action dimension: `free_log_std`)."""

    @classmethod
    def from_logits(cls, logits: torch.Tensor, **kwargs) -> TorchBoundedMeanGaussian:
        mu, log_std = logits.chunk(2, dim=-1)
        return cls(loc=torch.tanh(mu), scale=log_std.exp())


class TorchTanhDeterministic(TorchDeterministic):
    """The deterministic policy of d3rlpy's and CORL's BC over actions rescaled to [-1, 1]: the action tanh(mu),
    fitted by squared error. Its inputs are mu alone; it has no density, so BC fits its `loc` (offline_marwil.py)."""

    @classmethod
    def from_logits(cls, logits: torch.Tensor, **kwargs) -> TorchTanhDeterministic:
        return cls(loc=torch.tanh(logits))
