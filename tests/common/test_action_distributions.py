"""The IQL paper's Gaussian: a tanh-bounded mean, the Gaussian's own density around it."""

from __future__ import annotations

import torch

from common.action_distributions import TorchBoundedMeanGaussian


def test_its_mode_stays_within_the_bounds_and_its_density_is_the_gaussians():
    mu, log_std = torch.tensor([[0.0, 5.0], [-30.0, 0.3]]), torch.tensor([[-1.0, 0.5], [0.0, -2.0]])
    dist = TorchBoundedMeanGaussian.from_logits(torch.cat([mu, log_std], dim=-1))
    mode = dist.to_deterministic().sample()
    torch.testing.assert_close(mode, torch.tanh(mu))
    assert mode.abs().max() <= 1.0
    actions = torch.tensor([[1.0, -1.0], [0.99, 0.0]])  # at the bounds, the density stays finite
    expected = torch.distributions.Normal(torch.tanh(mu), log_std.exp()).log_prob(actions).sum(-1)
    torch.testing.assert_close(dist.logp(actions), expected)
    assert torch.isfinite(dist.logp(actions)).all()
