"""Our learners' single finiteness check (a non-finite update is skipped whole and counted, a finite one applied
by the fused Adam), and what they do in fewer ops than RLlib with the same results: global-norm clipping,
categorical log-probabilities, step counters."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.core.learner.learner import Learner
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils import torch_utils
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from dataset_format import Col
from pipelines.params import load_params
from tests.conftest import built_algorithm, train_columns
from training.algorithms.lean_learner import SKIPPED_UPDATES, LogSoftmaxCategorical, clip_gradients
from training.algorithms.rllib_internals import local_learner, named_optimizers


def _weights(learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.module[DEFAULT_MODULE_ID].parameters()]


def test_update_with_nan_gradients_is_skipped_and_a_finite_one_applied(expert_dataset, ray_local):
    with built_algorithm("bc", load_params("params.yaml").algos.bc, expert_dataset) as algorithm:
        learner = local_learner(algorithm)
        columns = train_columns(algorithm, 64)

        def update(observations: torch.Tensor) -> dict:
            batch = SampleBatch({**columns, Col.OBS: observations})
            return learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: batch}, env_steps=64),
                                  timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 0})

        before = _weights(learner)
        poisoned = columns[Col.OBS].clone()
        poisoned[0, 0] = float("nan")
        results = update(poisoned)
        assert all(torch.equal(a, b) for a, b in zip(before, _weights(learner)))
        assert results[DEFAULT_MODULE_ID][SKIPPED_UPDATES].peek() == 1

        assert all(group["fused"] for optimizer in named_optimizers(learner).values()
                   for group in optimizer.param_groups)
        update(columns[Col.OBS])
        assert not all(torch.equal(a, b) for a, b in zip(before, _weights(learner)))


def test_global_norm_clipping_matches_rllibs():
    shapes = [(256, 4), (256,), (256, 256), (2, 256), (2,)]
    generator = torch.Generator().manual_seed(0)
    for scale in (0.001, 100.0):  # below and above the clip value
        ours = {i: torch.randn(shape, generator=generator) * scale for i, shape in enumerate(shapes)}
        theirs = {i: gradient.clone() for i, gradient in ours.items()}
        norm = clip_gradients(ours, grad_clip=40.0, grad_clip_by="global_norm")
        expected = torch_utils.clip_gradients(theirs, grad_clip=40.0, grad_clip_by="global_norm")
        torch.testing.assert_close(norm, expected)
        for i in ours:
            torch.testing.assert_close(ours[i], theirs[i])
    assert torch_utils.compute_global_norm(list(ours.values())) <= 40.0 + 1e-3


def test_log_softmax_categorical_equals_rllibs_categorical():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 3, generator=generator, requires_grad=True)
    actions = torch.randint(0, 3, (64,), generator=generator)
    ours, rllibs = LogSoftmaxCategorical.from_logits(logits), TorchCategorical.from_logits(logits)
    torch.testing.assert_close(ours.logp(actions), rllibs.logp(actions))
    gradient, = torch.autograd.grad(ours.logp(actions).sum(), logits)
    expected, = torch.autograd.grad(rllibs.logp(actions).sum(), logits)
    torch.testing.assert_close(gradient, expected)
    torch.testing.assert_close(ours.entropy(), rllibs.entropy())  # built on demand
    assert ours.sample().shape == (64,)
    probs = torch.softmax(logits.detach(), dim=-1)
    torch.testing.assert_close(LogSoftmaxCategorical(probs=probs).logp(actions),
                               TorchCategorical(probs=probs).logp(actions))


def test_step_counters_of_an_update_equal_rllibs_per_minibatch_counters(expert_dataset, ray_local):
    with built_algorithm("bc", load_params("params.yaml").algos.bc, expert_dataset) as algorithm:
        learner = local_learner(algorithm)
        assert learner.module[DEFAULT_MODULE_ID].unwrapped().action_dist_cls is LogSoftmaxCategorical
        minibatches = []
        count_rows = learner._log_steps_trained_metrics
        learner._log_steps_trained_metrics = lambda batch: (minibatches.append(batch), count_rows(batch))
        ours = learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(train_columns(algorithm, 96))},
                                                    env_steps=96),
                              minibatch_size=32, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 0})

        # RLlib's counters, logged for each of the update's minibatches.
        rllibs = SimpleNamespace(metrics=MetricsLogger(), _weights_seq_no=learner._weights_seq_no)
        for minibatch in minibatches:
            Learner._log_steps_trained_metrics(rllibs, minibatch)
        expected = rllibs.metrics.reduce()
    assert len(minibatches) == 3
    for group, stats in expected.items():
        for name, stat in stats.items():
            assert ours[group][name].peek() == stat.peek(), (group, name)
