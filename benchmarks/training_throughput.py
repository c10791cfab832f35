"""Training throughput: samples/s of each RLlib offline learner ÷ a plain torch loop, measured in one run.

The plain loop is the ceiling: the same network (encoder `hidden_layers`, RLlib's default heads), batch size,
optimizer, gradient clipping and loss (MARWIL's value targets bootstrapped at the time limit, as its learner
does), with the whole dataset already in memory as tensors and batches drawn by random index. RLlib's number
is the steady state (iterations after the first); start-up is the time from building the algorithm to the
end of its first iteration (Ray already running). A third number feeds RLlib's learner batches made ahead:
its ratio is the ceiling the data pipeline cannot raise. Hyper-parameters come from params.yaml's `algos`.

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
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collectors import dataset  # noqa: E402
from collectors.dataset import Col, column_to_numpy  # noqa: E402
from pipelines.cli import start_ray  # noqa: E402
from pipelines.params import load_params  # noqa: E402
from training.algorithms import rllib_config  # noqa: E402
from training.config import DQNParams, LearnerParams, MARWILParams  # noqa: E402
from training.batch_columns import (  # noqa: E402
    BOOTSTRAP_DISCOUNT, BOOTSTRAP_OBS, VALUE_TARGETS, with_returns)

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU}
AHEAD_BATCHES = 16


def encoder(inputs: int, params: LearnerParams) -> nn.Sequential:
    layers, width = [], inputs
    for size in params.hidden_layers:
        layers += [nn.Linear(width, size), ACTIVATIONS[params.activation]()]
        width = size
    return nn.Sequential(*layers)


def plain_loop(algo: str, params: LearnerParams, table: pa.Table, updates: int, grad_clip: float | None) -> float:
    """Samples/s of `updates` gradient steps of the algorithm's loss, data in memory; gradients clipped to a
    global norm of `grad_clip` where RLlib's learner clips them (DQN)."""
    arrays = {name: column_to_numpy(table[name]) for name in table.column_names}
    obs, next_obs = torch.as_tensor(arrays[Col.OBS]), torch.as_tensor(arrays[Col.NEW_OBS])
    actions = torch.as_tensor(arrays[Col.ACTIONS]).long()
    rewards, done = torch.as_tensor(arrays[Col.REWARDS]), torch.as_tensor(arrays[Col.TERMINATEDS]).float()
    n_actions, width = int(actions.max()) + 1, params.hidden_layers[-1]
    body = encoder(obs.shape[1], params)
    heads = nn.ModuleDict({"pi": nn.Linear(width, n_actions), "vf": nn.Linear(width, 1)})
    critic_body = encoder(obs.shape[1], params)  # MARWIL's value function has its own layers
    model = nn.ModuleDict({"body": body, "heads": heads, "critic_body": critic_body})
    target = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=params.lr, fused=True)  # as our learners run it
    # MARWIL's value targets as its learner reads them: returns-to-go, bootstrapped where the time limit cut.
    marwil_columns = with_returns(table, getattr(params, "gamma", 0.99))
    returns, bootstrap_obs, bootstrap_discount = (torch.as_tensor(marwil_columns[f"{DEFAULT_MODULE_ID}/{name}"])
                                                  for name in (VALUE_TARGETS, BOOTSTRAP_OBS, BOOTSTRAP_DISCOUNT))

    def q_values(net, x):  # dueling: V + A - mean(A)
        h = net["body"](x)
        a = net["heads"]["pi"](h)
        return net["heads"]["vf"](h) + a - a.mean(dim=1, keepdim=True)

    started = time.perf_counter()
    for step in range(updates):
        i = torch.randint(0, len(obs), (params.batch_size,))
        if isinstance(params, DQNParams):
            with torch.no_grad():
                best = q_values(model, next_obs[i]).argmax(1, keepdim=True)
                y = rewards[i] + params.gamma * (1 - done[i]) * q_values(target, next_obs[i]).gather(1, best).squeeze(1)
            loss = F.huber_loss(q_values(model, obs[i]).gather(1, actions[i, None]).squeeze(1), y)
            if step % params.target_update_every == 0:
                target.load_state_dict(model.state_dict())
        else:
            h = body(obs[i])
            logp = torch.log_softmax(heads["pi"](h), dim=1).gather(1, actions[i, None]).squeeze(1)
            if isinstance(params, MARWILParams):
                with torch.no_grad():
                    bootstrap = heads["vf"](critic_body(bootstrap_obs[i])).squeeze(1)
                targets = returns[i] + bootstrap_discount[i] * bootstrap
                value = heads["vf"](critic_body(obs[i])).squeeze(1)
                weights = torch.exp(params.beta * (targets - value).detach()).clamp(max=20.0)
                loss = -(weights * logp).mean() + params.vf_coeff * F.mse_loss(value, targets)
            else:
                loss = -logp.mean()
        optimizer.zero_grad()
        loss.backward()
        if grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
    return updates * params.batch_size / (time.perf_counter() - started)


def rllib_loop(algo: str, params: LearnerParams, spaces, dataset_dir: Path,
               iterations: int) -> tuple[float, float, float]:
    """(start-up seconds, steady-state samples/s, samples/s of the learner alone on batches made ahead)."""
    started = time.perf_counter()
    algorithm = rllib_config(algo, params, spaces, dataset_dir, seed=0).build_algo()
    try:
        algorithm.train()
        startup = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(iterations):
            algorithm.train()
        samples = iterations * params.updates_per_iteration * params.batch_size * max(1, params.num_learners)
        rate = samples / (time.perf_counter() - started)
        learner_rate = (learner_alone(algorithm, params, iterations * params.updates_per_iteration)
                        if params.num_learners == 0 else float("nan"))
    finally:
        algorithm.stop()
        del algorithm
        gc.collect()
    return startup, rate, learner_rate


def learner_alone(algorithm, params: LearnerParams, updates: int) -> float:
    """Samples/s of RLlib's `Learner.update` on batches made ahead, with no data pipeline.

    The batches cycle through `AHEAD_BATCHES` distinct ones (a single batch, fitted over and over, drives the
    network into a regime the real runs never see), and metrics are reduced once per iteration, as in training.
    """
    rng = np.random.default_rng(0)
    data = algorithm.offline_data.data.take_batch(AHEAD_BATCHES * params.batch_size, batch_format="numpy")
    rows = rng.permutation(AHEAD_BATCHES * params.batch_size).reshape(AHEAD_BATCHES, params.batch_size)
    batches = [MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(
        {key.split("/", 1)[1]: torch.as_tensor(np.asarray(values)[picked]) for key, values in data.items()})},
        env_steps=params.batch_size) for picked in rows]
    learner = algorithm.learner_group._learner  # the local learner (num_learners=0)
    started = time.perf_counter()
    for update in range(updates):
        learner.update(training_data=TrainingData(batch=batches[update % AHEAD_BATCHES]),
                       minibatch_size=params.batch_size, num_epochs=1,
                       timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 0}, _no_metrics_reduce=True)
        if (update + 1) % params.updates_per_iteration == 0:
            learner.metrics.reduce()
    return updates * params.batch_size / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--dataset", type=Path, default=ROOT / "datasets" / "cartpole-medium")
    parser.add_argument("--algos", nargs="+", default=["bc", "marwil", "dqn"])
    parser.add_argument("--iterations", type=int, default=10, help="steady-state iterations timed for RLlib")
    parser.add_argument("--learners", type=int, nargs="+",
                        help="num_learners values to compare (default: params.yaml's); samples/s counts every "
                             "learner's batch, the learner-alone column is for 0 only")
    args = parser.parse_args()

    params = load_params(args.params)
    start_ray(params.ray)
    torch.manual_seed(0)
    table = dataset.load_table(args.dataset)
    spaces = dataset.read_card(args.dataset).spaces
    rows = ["| learner | num_learners | batch | RLlib start-up (s) | RLlib samples/s | plain torch samples/s | ratio | "
            "RLlib learner alone: ratio |", "|---|---|---|---|---|---|---|---|"]
    for algo in args.algos:
        algo_params = params.algos.get(algo)
        counts = args.learners or [algo_params.num_learners]
        measured = [rllib_loop(algo, dataclasses.replace(algo_params, num_learners=learners), spaces, args.dataset,
                               args.iterations) for learners in counts]
        grad_clip = rllib_config(algo, algo_params, spaces, args.dataset, seed=0).grad_clip
        plain_rate = plain_loop(algo, algo_params, table, args.iterations * algo_params.updates_per_iteration,
                                grad_clip)
        for learners, (startup, rllib_rate, learner_rate) in zip(counts, measured):
            rows.append(f"| {algo} | {learners} | {algo_params.batch_size} | {startup:.1f} | {rllib_rate:,.0f} | "
                        f"{plain_rate:,.0f} | {rllib_rate / plain_rate:.2f} | {learner_rate / plain_rate:.2f} |")
            print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
