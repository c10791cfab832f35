"""Training throughput: samples/s of each RLlib offline learner ÷ a plain torch loop, measured in one run.

The plain loop is the ceiling: the same network (an MLP of `hidden_layers` over vectors, the CNN of `conv_filters`
over frames with `hidden_layers` in each head; the last column counts both networks' parameters), batch size,
optimizer, gradient clipping and loss (MARWIL's value targets bootstrapped at the time limit, as its learner
does; IQL's three losses, with Polyak-averaged twin target critics), with the whole dataset already in memory as
tensors and batches drawn by random index. RLlib's number is the steady state (iterations after the first);
start-up is the time from building the algorithm to the end of its first iteration (Ray already running). A third
number feeds RLlib's learner batches made ahead: its ratio is the ceiling the data pipeline cannot raise. The three
loops take turns, one iteration's updates each. Hyper-parameters come from params.yaml's `algos`. With
`--gpus-per-learner`, RLlib's learner trains on the GPU and the plain loop holds the data there and trains there.
The plain loop always holds the data; RLlib's learner holds it where it fits `memory_cache_mib` (`--memory-cache-mib`
sets it) and streams it otherwise, as the table's "RLlib data" column says.

    python benchmarks/training_throughput.py --dataset datasets/cartpole-medium --iterations 10
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import torch.nn as nn
import torch.nn.functional as F
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.models.torch.misc import same_padding
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

import dataset_format as dataset
from common.errors import exit_on_user_error
from common.observations import ModelInput
from common.ray_runtime import start_ray
from dataset_format import Col, column_to_numpy
from pipelines.params import load_params
from training.algorithms.batch_columns import BOOTSTRAP_DISCOUNT, BOOTSTRAP_OBS, VALUE_TARGETS, with_returns
from training.algorithms.registry import rllib_config
from training.algorithms.rllib_internals import local_learner, update_without_reducing_metrics
from training.config import DQNParams, IQLParams, LearnerParams, MARWILParams

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "benchmarks" / "suite"  # the full suite's pipeline: its params and datasets

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU}
AHEAD_BATCHES = 16


def encoder(observations: ModelInput, params: LearnerParams) -> tuple[nn.Sequential, int]:
    """The layers before the heads, as RLlib builds them, and their output width: over vectors an MLP of
    `hidden_layers`; over frames (taken channels first here) a CNN of `conv_filters` with RLlib's "same" padding,
    flattened (`head` then gives each output its own `hidden_layers`)."""
    layers, shape = [], observations.input_shape
    if len(shape) == 1:
        return hidden_layers(params, shape[0])
    height, width, channels = shape
    for out_channels, kernel, stride in params.conv_filters:
        padding, (height, width) = same_padding((height, width), kernel, stride)  # RLlib's own
        layers += [nn.ZeroPad2d(padding), nn.Conv2d(channels, out_channels, kernel, stride),
                   ACTIVATIONS[params.activation]()]
        channels = out_channels
    return nn.Sequential(*layers, nn.Flatten()), height * width * channels


def hidden_layers(params: LearnerParams, width: int) -> tuple[nn.Sequential, int]:
    """An MLP of `hidden_layers` over `width` inputs, and its output width."""
    layers = []
    for size in params.hidden_layers:
        layers += [nn.Linear(width, size), ACTIVATIONS[params.activation]()]
        width = size
    return nn.Sequential(*layers), width


def head(observations: ModelInput, params: LearnerParams, width: int, outputs: int) -> nn.Sequential:
    """An output over the encoder's features, as RLlib builds it: one linear layer over vectors; over frames the
    `hidden_layers` first (registry.py's `head_fcnet_hiddens`)."""
    if len(observations.input_shape) == 1:
        return nn.Sequential(nn.Linear(width, outputs))
    layers, width = hidden_layers(params, width)
    return nn.Sequential(layers, nn.Linear(width, outputs))


class PlainLoop:
    """The loss of the algorithm `params` configures, in a plain torch loop, data in memory; gradients
    clipped to a global norm of `grad_clip` where RLlib's learner clips them (DQN). `run` times a number of
    updates; the network keeps training across calls."""

    def __init__(self, params: LearnerParams, table: pa.Table, observation_space, grad_clip: float | None,
                 device: torch.device):
        """Rows are held on `device` as stored (frames as uint8), and made the network's input per batch."""
        arrays = {name: column_to_numpy(table[name]) for name in table.column_names}
        self.params, self.grad_clip, self.step, self.device = params, grad_clip, 0, device
        self.observations = ModelInput.of(observation_space)
        self.obs, self.next_obs = (torch.as_tensor(arrays[name]).to(device) for name in (Col.OBS, Col.NEW_OBS))
        self.actions = torch.as_tensor(arrays[Col.ACTIONS]).long().to(device)
        self.rewards = torch.as_tensor(arrays[Col.REWARDS]).to(device)
        self.done = torch.as_tensor(arrays[Col.TERMINATEDS]).float().to(device)
        n_actions = int(self.actions.max()) + 1
        self.body, width = encoder(self.observations, params)
        self.heads = nn.ModuleDict({"pi": head(self.observations, params, width, n_actions),
                                    "vf": head(self.observations, params, width, 1)})
        self.critic_body, _ = encoder(self.observations, params)  # MARWIL's value function has its own layers
        self.model = nn.ModuleDict({"body": self.body, "heads": self.heads, "critic_body": self.critic_body})
        if isinstance(params, IQLParams):  # IQL's policy, value function and twin critics, each its own network
            self.model = nn.ModuleDict({name: nn.Sequential(encoder(self.observations, params)[0],
                                                            head(self.observations, params, width, out))
                                        for name, out in (("pi", n_actions), ("vf", 1), ("qf", n_actions),
                                                          ("qf_twin", n_actions))})
        self.model.to(device)
        self.target = copy.deepcopy(self.model if not isinstance(params, IQLParams) else
                                    nn.ModuleDict({q: self.model[q] for q in ("qf", "qf_twin")}))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=params.lr, fused=True)  # as our learners
        if isinstance(params, MARWILParams):
            # Its value targets as its learner reads them: returns-to-go, bootstrapped where the time limit cut.
            marwil_columns = with_returns(table, params.gamma)
            self.returns, self.bootstrap_obs, self.bootstrap_discount = (
                torch.as_tensor(marwil_columns[f"{DEFAULT_MODULE_ID}/{name}"]).to(device)
                for name in (VALUE_TARGETS, BOOTSTRAP_OBS, BOOTSTRAP_DISCOUNT))

    def network_input(self, rows: torch.Tensor) -> torch.Tensor:
        """Stored observations as the network takes them: frames as float in [0, 1], channels first (torch's
        convolutions' own order), vectors as they are."""
        observations = self.observations
        if len(observations.input_shape) == 1:
            return rows
        frames = rows.view(-1, *observations.shape).float().mul_(observations.scale)
        return frames if observations.channels_first else frames.permute(0, 3, 1, 2)

    @staticmethod
    def q_values(net, x):  # dueling: V + A - mean(A)
        h = net["body"](x)
        a = net["heads"]["pi"](h)
        return net["heads"]["vf"](h) + a - a.mean(dim=1, keepdim=True)

    def iql_loss(self, i: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        params, net, actions = self.params, self.model, self.actions[i, None]
        next_obs = self.network_input(self.next_obs[i])
        with torch.no_grad():
            q_target = torch.min(*(self.target[q](obs).gather(1, actions) for q in ("qf", "qf_twin"))).squeeze(1)
            td_target = self.rewards[i] + params.gamma * (1 - self.done[i]) * net["vf"](next_obs).squeeze(1)
        advantages = q_target - net["vf"](obs).squeeze(1)
        value_loss = (torch.where(advantages > 0, params.expectile, 1 - params.expectile) * advantages.square()).mean()
        weights = torch.exp(params.beta * advantages.detach()).clamp(max=100.0)
        logp = torch.log_softmax(net["pi"](obs), dim=1).gather(1, actions).squeeze(1)
        q_loss = sum(F.mse_loss(net[q](obs).gather(1, actions).squeeze(1), td_target) for q in ("qf", "qf_twin"))
        return value_loss - (weights * logp).mean() + q_loss

    def loss(self, i: torch.Tensor) -> torch.Tensor:
        params, obs = self.params, self.network_input(self.obs[i])
        if isinstance(params, IQLParams):
            return self.iql_loss(i, obs)
        if isinstance(params, DQNParams):
            with torch.no_grad():
                next_obs = self.network_input(self.next_obs[i])
                best = self.q_values(self.model, next_obs).argmax(1, keepdim=True)
                next_q = self.q_values(self.target, next_obs).gather(1, best).squeeze(1)
                y = self.rewards[i] + params.gamma * (1 - self.done[i]) * next_q
            if self.step % params.target_update_every == 0:
                self.target.load_state_dict(self.model.state_dict())
            return F.huber_loss(self.q_values(self.model, obs).gather(1, self.actions[i, None]).squeeze(1), y)
        logp = torch.log_softmax(self.heads["pi"](self.body(obs)), dim=1)
        logp = logp.gather(1, self.actions[i, None]).squeeze(1)
        if not isinstance(params, MARWILParams):
            return -logp.mean()
        with torch.no_grad():
            bootstrap = self.heads["vf"](self.critic_body(self.network_input(self.bootstrap_obs[i]))).squeeze(1)
        targets = self.returns[i] + self.bootstrap_discount[i] * bootstrap
        value = self.heads["vf"](self.critic_body(obs)).squeeze(1)
        weights = torch.exp(params.beta * (targets - value).detach()).clamp(max=20.0)
        return -(weights * logp).mean() + params.vf_coeff * F.mse_loss(value, targets)

    def run(self, updates: int) -> float:
        """Seconds for `updates` gradient steps."""
        started = time.perf_counter()
        for _ in range(updates):
            loss = self.loss(torch.randint(0, len(self.obs), (self.params.batch_size,), device=self.device))
            self.optimizer.zero_grad()
            loss.backward()
            if self.grad_clip:
                nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.optimizer.step()
            self.step += 1
            if isinstance(self.params, IQLParams):  # Polyak-averaged target critics, every update
                with torch.no_grad():
                    for q in self.target:
                        for target, online in zip(self.target[q].parameters(), self.model[q].parameters()):
                            target.lerp_(online, self.params.tau)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    def trained_parameters(self) -> int:
        """Parameters the loss has updated (after a first `run`): the network RLlib's module should match."""
        return sum(p.numel() for p in self.model.parameters() if p.grad is not None)


@dataclasses.dataclass
class Measurement:
    held: bool
    """RLlib's learner held the dataset in memory (else it streamed it)."""
    startup_s: float
    rllib: float
    """Steady-state samples/s of RLlib's training iterations."""
    learner_alone: float
    """Samples/s of its learner alone, on batches made ahead (nan with learner actors)."""
    plain: float
    """Samples/s of the plain loop."""
    parameters: tuple[int, int]
    """The parameters of RLlib's module and those the plain loop trains: equal when the networks are the same."""


def measure(algo: str, params: LearnerParams, dataset_dir: Path, table: pa.Table, iterations: int) -> Measurement:
    """RLlib, its learner alone and the plain loop on one dataset, on the GPU where `num_gpus_per_learner` asks
    for one.

    The three run in turn, one iteration's updates each, `iterations` rounds: this machine's speed drifts by
    tens of percent over a minute, and timed one after the other they would each see a different machine.
    """
    device = torch.device("cuda" if params.num_gpus_per_learner else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    started = time.perf_counter()
    config = rllib_config(algo, params, dataset_dir, seed=0)
    rllib_parameters = sum(p.numel() for p in config.get_rl_module_spec().build().parameters())
    algorithm = config.build_algo()
    try:
        algorithm.train()
        sync()
        startup = time.perf_counter() - started
        plain = PlainLoop(params, table, dataset.read_card(dataset_dir).spaces[0], algorithm.config.grad_clip, device)
        local_learner = params.num_learners == 0
        learner = LearnerAlone(algorithm, params) if local_learner else None
        for warm_up in (learner, plain) if local_learner else (plain,):  # as RLlib's first iteration, untimed
            warm_up.run(params.updates_per_iteration)
        seconds = {"rllib": 0.0, "learner": 0.0, "plain": 0.0}
        for _ in range(iterations):
            started = time.perf_counter()
            algorithm.train()
            sync()
            seconds["rllib"] += time.perf_counter() - started
            if local_learner:
                seconds["learner"] += learner.run(params.updates_per_iteration)
            seconds["plain"] += plain.run(params.updates_per_iteration)
    finally:
        algorithm.stop()
        del algorithm
        gc.collect()
    samples = iterations * params.updates_per_iteration * params.batch_size
    return Measurement(config.materialize_mapped_data, startup,
                       samples * max(1, params.num_learners) / seconds["rllib"],
                       samples / seconds["learner"] if local_learner else float("nan"), samples / seconds["plain"],
                       (rllib_parameters, plain.trained_parameters()))


class LearnerAlone:
    """RLlib's `Learner.update` on batches made ahead, with no data pipeline (the local learner,
    num_learners=0).

    The batches cycle through `AHEAD_BATCHES` distinct ones (a single batch, fitted over and over, drives the
    network into a regime the real runs never see), and metrics are reduced once per call, as once per
    iteration in training.
    """

    def __init__(self, algorithm, params: LearnerParams):
        rng = np.random.default_rng(0)
        # The network's input (images mapped on the CPU), made ahead of the clock.
        data = algorithm.offline_data.sample(num_samples=AHEAD_BATCHES * params.batch_size)[DEFAULT_MODULE_ID]
        rows = len(data[Col.OBS])  # fewer than asked for where the dataset is smaller
        order = rng.integers(rows, size=(AHEAD_BATCHES, params.batch_size))
        self.batches = [MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(
            {key: values[picked] for key, values in data.items()})}, env_steps=params.batch_size) for picked in order]
        self.learner = local_learner(algorithm)
        self.batch_size, self.updates = params.batch_size, 0

    def run(self, updates: int) -> float:
        """Seconds for `updates` updates."""
        started = time.perf_counter()
        for _ in range(updates):
            batch = self.batches[self.updates % AHEAD_BATCHES]
            update_without_reducing_metrics(
                self.learner, training_data=TrainingData(batch=batch), minibatch_size=self.batch_size, num_epochs=1,
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 0})
            self.updates += 1
        self.learner.metrics.reduce()
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(SUITE / "params.yaml"))
    parser.add_argument("--dataset", type=Path, default=SUITE / "datasets" / "cartpole-medium")
    parser.add_argument("--algos", nargs="+", default=["bc", "marwil", "dqn"])
    parser.add_argument("--iterations", type=int, default=10, help="steady-state iterations timed for RLlib")
    parser.add_argument("--learners", type=int, nargs="+",
                        help="num_learners values to compare (default: params.yaml's); samples/s counts every "
                             "learner's batch, the learner-alone column is for 0 only")
    parser.add_argument("--gpus-per-learner", type=float, default=0.0,
                        help="num_gpus_per_learner for RLlib; above 0 the plain loop runs on the GPU too")
    parser.add_argument("--batch-size", type=int, help="instead of params.yaml's")
    parser.add_argument("--memory-cache-mib", type=int,
                        help="instead of params.yaml's: RLlib's learner holds a dataset that fits it in memory (on "
                             "its GPU with --gpus-per-learner) and streams one that does not")
    args = parser.parse_args()

    params = load_params(args.params)
    start_ray(params.ray.num_cpus)
    torch.manual_seed(0)
    table = dataset.load_table(args.dataset)
    rows = ["| learner | num_learners | GPUs per learner | batch | RLlib data | RLlib start-up (s) | RLlib samples/s | "
            "plain torch samples/s | ratio | RLlib learner alone: ratio | parameters: RLlib / plain |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for algo in args.algos:
        algo_params = dataclasses.replace(params.algos.get(algo), num_gpus_per_learner=args.gpus_per_learner)
        if args.batch_size:
            algo_params = dataclasses.replace(algo_params, batch_size=args.batch_size)
        if args.memory_cache_mib is not None:
            algo_params = dataclasses.replace(algo_params, memory_cache_mib=args.memory_cache_mib)
        for learners in args.learners or [algo_params.num_learners]:
            m = measure(algo, dataclasses.replace(algo_params, num_learners=learners), args.dataset, table,
                        args.iterations)
            rows.append(f"| {algo} | {learners} | {args.gpus_per_learner:g} | {algo_params.batch_size} | "
                        f"{'held' if m.held else 'streamed'} | {m.startup_s:.1f} | {m.rllib:,.0f} | {m.plain:,.0f} | "
                        f"{m.rllib / m.plain:.2f} | {m.learner_alone / m.plain:.2f} | "
                        f"{m.parameters[0]:,} / {m.parameters[1]:,} |")
            print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    exit_on_user_error(main)
