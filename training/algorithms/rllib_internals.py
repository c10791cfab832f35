"""The one wall between our learners and RLlib's (and torch's) private APIs.

RLlib's new API stack leaves no public way to train DQN and CQL from offline data alone or to take some
per-update costs out of its learners (see the modules beside this one). Every private name we read, set, call or
override is listed in `HOOKS` with why we need it, and reached only through this module: accessors for attributes
and calls, and the `private_hook` decorator for methods our subclasses override. Tests and benchmarks use the
accessors too.
`tests/training/algorithms/test_rllib_internals.py` fails, naming the hooks to re-check, when the installed Ray or
torch is not the version they were written for or a hook is gone, and fails on any private name of a library used
anywhere in the repository (tests and benchmarks included) that is not listed here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

WRITTEN_FOR = {"ray": "2.60.0", "torch": "2.13.0"}


@dataclass(frozen=True)
class Hook:
    """A private name in RLlib or torch that our code depends on."""

    owner: str
    """`module:Qualname` of the class (or module) that defines it."""
    name: str
    """The attribute, method or function."""
    why: str
    """What we use it for, and what breaks without it."""

    @property
    def key(self) -> str:
        return f"{self.owner.split(':')[-1]}.{self.name}"


HOOKS = {hook.key: hook for hook in (
    Hook("ray.rllib.algorithms.algorithm_config:AlgorithmConfig", "_is_online",
         "DQN and CQL configs count as online, so their algorithms build env runners (and fail without an env); "
         "set False, as RLlib's own BC/MARWIL configs do, for offline training with none."),
    Hook("ray.rllib.algorithms.dqn.dqn:DQN", "_module_is_stateful",
         "DQN.setup (which CQL inherits through SAC) asks env runners whether the module is stateful; offline "
         "there are none, so setup skips to Algorithm.setup and sets it to False."),
    Hook("ray.rllib.core.learner.learner:Learner", "_log_steps_trained_metrics",
         "overridden to count rows per minibatch and log RLlib's step counters once per update call."),
    Hook("ray.rllib.core.learner.learner:Learner", "_weights_seq_no",
         "logged as WEIGHTS_SEQ_NO, as RLlib's own _log_steps_trained_metrics does."),
    Hook("ray.rllib.core.learner.torch.torch_learner:TorchLearner", "_get_clip_function",
         "overridden to clip by global norm with torch's foreach ops."),
    Hook("ray.rllib.core.distribution.torch.torch_distribution:TorchCategorical", "_dist",
         "LogSoftmaxCategorical builds torch's Categorical lazily, only for the methods that need it."),
    Hook("ray.rllib.core.distribution.torch.torch_distribution:TorchCategorical", "_get_torch_distribution",
         "builds the lazily created torch Categorical."),
    Hook("ray.rllib.core.distribution.torch.torch_distribution:TorchCategorical", "_one_hot",
         "set as TorchCategorical.__init__ would, which LogSoftmaxCategorical does not call."),
    Hook("ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module:DefaultDQNTorchRLModule", "_qf_forward_helper",
         "overridden to centre dueling advantages with a plain mean (RLlib's is nan-aware, for action masks)."),
    Hook("ray.rllib.algorithms.sac.sac_catalog:SACCatalog", "_build_qf_encoder_continuous",
         "overridden to build the CQL paper's Q-network: one MLP over observation and action concatenated."),
    Hook("ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module:DefaultSACTorchRLModule",
         "_qf_forward_train_helper",
         "a Q-network's (or target's) outputs for a batch, which IQL's training pass reads at the data's actions "
         "instead of running SAC's whole training pass."),
    Hook("ray.rllib.core.models.catalog:Catalog", "_encoder_config",
         "the policy's encoder config, which the Q-network copies (layers, activation, initializers)."),
    Hook("ray.rllib.algorithms.marwil.torch.marwil_torch_learner:MARWILTorchLearner",
         "moving_avg_sqd_adv_norms_per_module",
         "MARWIL's running mean of squared advantages, started at the first batch's value instead of 100."),
    Hook("ray.rllib.core.learner.learner_group:LearnerGroup", "_learner",
         "the learner of a group with no remote learners (num_learners 0), which tests and benchmarks drive "
         "directly; RLlib's public API reaches it only through remote calls."),
    Hook("ray.rllib.algorithms.cql.torch.cql_torch_learner:CQLTorchLearner", "_temp_losses",
         "the losses CQL's compute_gradients backpropagates, one per optimizer; our CQL adds its learned "
         "conservative weight's loss there (offline_cql.py)."),
    Hook("ray.rllib.core.learner.learner:Learner", "_named_optimizers",
         "the learner's optimizers, which tests check were built fused (lean_learner.py)."),
    Hook("ray.rllib.core.learner.learner:Learner", "_no_metrics_reduce",
         "Learner.update's flag to skip reducing metrics, so the training-throughput benchmark reduces them once "
         "per timed call, as training does once per iteration."),
    Hook("torch", "_foreach_norm", "the norms of all gradient tensors in one op, for clipping by global norm."),
    Hook("torch", "_foreach_mul_", "scales all gradient tensors in one op, for clipping by global norm."),
    Hook("torch", "_foreach_lerp_", "moves all target-network tensors towards the online ones in one op (Polyak "
         "averaging at every gradient update)."),
)}


def private_hook(key: str):
    """Marks a method that overrides the private RLlib method `key` ("Class.name", listed in HOOKS)."""
    if key not in HOOKS:
        raise KeyError(f"{key} is not listed in training/algorithms/rllib_internals.py HOOKS; add it with why")

    return lambda method: method


def resolve(hook: Hook):
    """The class or module that owns `hook` in the installed packages."""
    module_name, _, qualname = hook.owner.partition(":")
    owner = importlib.import_module(module_name)
    for part in filter(None, qualname.split(".")):
        owner = getattr(owner, part)
    return owner


# ---------------------------------------------------------------- accessors, one per hook that is read or set


def mark_offline(config) -> None:
    """AlgorithmConfig._is_online"""
    config._is_online = False


def skip_stateful_module_check(algorithm) -> None:
    """DQN._module_is_stateful"""
    algorithm._module_is_stateful = False


def local_learner(algorithm):
    """LearnerGroup._learner: the algorithm's learner, in this process (num_learners 0)."""
    return algorithm.learner_group._learner


def named_optimizers(learner) -> dict:
    """Learner._named_optimizers"""
    return learner._named_optimizers


def temp_losses(learner) -> dict:
    """CQLTorchLearner._temp_losses: {(module_id, optimizer name + "_loss"): loss} for its compute_gradients."""
    return learner._temp_losses


def update_without_reducing_metrics(learner, **update_kwargs) -> None:
    """Learner.update(..., _no_metrics_reduce=True): the caller reduces `learner.metrics` itself."""
    learner.update(**update_kwargs, _no_metrics_reduce=True)


def weights_seq_no(learner) -> int:
    """Learner._weights_seq_no"""
    return learner._weights_seq_no


def q_network_outputs(module, batch: dict, encoder, head):
    """DefaultSACTorchRLModule._qf_forward_train_helper, unsqueezed: (B, 1) for Box actions (Q of the batch's
    actions), (B, n) for Discrete (Q of every action)."""
    return module._qf_forward_train_helper(batch, encoder, head, squeeze=False)


def encoder_config(catalog):
    """Catalog._encoder_config"""
    return catalog._encoder_config


def categorical_without_init(distribution, logits) -> None:
    """TorchCategorical._one_hot: the state TorchCategorical.__init__ sets from logits, without building torch's
    Categorical."""
    distribution.logits, distribution.probs, distribution._one_hot = logits, None, None


def torch_categorical(distribution, logits):
    """TorchCategorical._get_torch_distribution"""
    return distribution._get_torch_distribution(logits=logits)


def squared_advantage_norms(learner) -> dict:
    """MARWILTorchLearner.moving_avg_sqd_adv_norms_per_module"""
    return learner.moving_avg_sqd_adv_norms_per_module


def foreach_norm(tensors):
    """torch._foreach_norm"""
    import torch

    return torch._foreach_norm(tensors)


def foreach_mul_(tensors, scalar) -> None:
    """torch._foreach_mul_"""
    import torch

    torch._foreach_mul_(tensors, scalar)


def foreach_lerp_(tensors, ends, weight: float) -> None:
    """torch._foreach_lerp_"""
    import torch

    torch._foreach_lerp_(tensors, ends, weight)
