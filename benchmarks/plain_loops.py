"""Diagnostic: d3rlpy's recipes as plain torch loops, on a dataset's columns as our learners read them.

- `discrete-cql`, DiscreteCQL's: one Q head (no dueling), double Q, Huber TD loss, alpha * (logsumexp Q - Q(data
  action)), a hard target sync every `--target-update-every` updates, Adam without gradient clipping.
- `bc`, continuous BC's (d3rlpy's and CORL's): tanh of an MLP's output fitted by squared error to the data's actions
  rescaled to [-1, 1], with Adam; it acts tanh(mu), rescaled back to the env's bounds.

Batches are drawn uniformly with replacement, as d3rlpy draws them, or with `--sampling passes` from a fresh
permutation of all rows at each pass, as our learners draw a dataset they hold in memory. The loops separate what an
algorithm does on some data from what RLlib or d3rlpy add: benchmarks/quality.md's parity notes compare their scores
with our learners' and d3rlpy's. Evaluated greedily on the pipeline's evaluation seeds, normalized with the
references the quality table uses.

    python benchmarks/plain_loops.py --recipe discrete-cql --dataset acrobot-medium --updates 10000 --seeds 0 1 2
    python benchmarks/plain_loops.py --recipe bc --params benchmarks/mujoco/params.yaml \
        --datasets-dir benchmarks/mujoco/datasets --references benchmarks/mujoco/references \
        --dataset halfcheetah-medium-replay --updates 100000 --lr 3e-4 --seeds 0 1
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable, Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from ray.rllib.core import DEFAULT_MODULE_ID
from torch import nn

import dataset_format as dataset
from collectors.rollout import episode_seeds
from common.envs import EnvSpec, make_env
from common.errors import exit_on_user_error
from evaluation.references import CEILING, no_score_reason, normalized_score, read_reference
from pipelines.params import load_params
from training.algorithms.batch_columns import (
    ACTIONS,
    NEXT_OBS,
    OBS,
    REWARDS,
    TERMINATEDS,
    cloning_batch_in_unit_actions,
    with_n_step,
)

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "benchmarks" / "suite"  # the full suite's pipeline: its params, datasets and references
SAMPLINGS = ("replacement", "passes")


def mlp(inputs: int, hidden: list[int], outputs: int) -> nn.Sequential:
    """d3rlpy's vector encoder (linear layers and ReLUs, torch's default initialization) and a linear output."""
    layers, width = [], inputs
    for units in hidden:
        layers += [nn.Linear(width, units), nn.ReLU()]
        width = units
    return nn.Sequential(*layers, nn.Linear(width, outputs))


def batch_rows(rows: int, batch_size: int, sampling: str, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless batches of row indices: uniform with replacement, or each pass a fresh permutation of all rows."""
    while True:
        if sampling == "replacement":
            yield torch.randint(rows, (batch_size,), generator=generator)
            continue
        order = torch.randperm(rows, generator=generator)
        for start in range(0, rows - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def train_discrete_cql(columns: dict[str, torch.Tensor], space: gym.spaces.Discrete, args, seed: int) -> Callable:
    torch.manual_seed(seed)
    q = mlp(columns[OBS].shape[1], args.hidden, int(space.n))
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=args.lr)
    batches = batch_rows(len(columns[OBS]), args.batch_size, args.sampling, torch.Generator().manual_seed(seed))
    for update in range(1, args.updates + 1):
        picked = next(batches)
        obs, action, reward, next_obs, terminated = (columns[name][picked]
                                                     for name in (OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS))
        q_values = q(obs)
        q_taken = q_values.gather(1, action.long()[:, None]).squeeze(1)
        with torch.no_grad():
            next_action = q(next_obs).argmax(1, keepdim=True)
            next_q = target(next_obs).gather(1, next_action).squeeze(1)
            td_target = reward + args.gamma * (1.0 - terminated.float()) * next_q
        penalty = (torch.logsumexp(q_values, dim=1) - q_taken).mean()
        loss = F.huber_loss(q_taken, td_target) + args.cql_alpha * penalty
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if update % args.target_update_every == 0:
            target.load_state_dict(q.state_dict())
    return lambda obs: int(q(obs).argmax())


def train_bc(columns: dict[str, torch.Tensor], space: gym.spaces.Box, args, seed: int) -> Callable:
    torch.manual_seed(seed)
    policy = mlp(columns[OBS].shape[1], args.hidden, int(np.prod(space.shape)))
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    batches = batch_rows(len(columns[OBS]), args.batch_size, args.sampling, torch.Generator().manual_seed(seed))
    for _ in range(args.updates):
        picked = next(batches)
        loss = (torch.tanh(policy(columns[OBS][picked])) - columns[ACTIONS][picked]).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    low, high = (torch.as_tensor(bound, dtype=torch.float32) for bound in (space.low, space.high))
    return lambda obs: (low + (torch.tanh(policy(obs)[0]) + 1.0) / 2.0 * (high - low)).numpy()


def columns_for(recipe: str, dataset_dir: Path, space: gym.Space, gamma: float) -> dict[str, torch.Tensor]:
    """The recipe's columns, mapped as our DQN (n-step 1) or our BC (actions in [-1, 1], no margin) map them, from
    the dataset's columns that the mapping reads."""
    if recipe == "discrete-cql":
        map_rows, options, names = with_n_step, {"n": 1, "gamma": gamma}, (OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS)
    else:
        map_rows, options, names = (cloning_batch_in_unit_actions,
                                    {"low": space.low, "high": space.high, "margin": 0.0}, (OBS, ACTIONS))
    mapped = map_rows(dataset.read_table(dataset_dir, columns=map_rows.columns), **options)
    return {name: torch.as_tensor(np.array(mapped[f"{DEFAULT_MODULE_ID}/{name}"])) for name in names}


RECIPES = {"discrete-cql": (gym.spaces.Discrete, train_discrete_cql), "bc": (gym.spaces.Box, train_bc)}


def episode_returns(act: Callable, env_spec: EnvSpec, seeds: list[int]) -> list[float]:
    env, returns = make_env(env_spec), []
    for env_seed in seeds:
        obs, _ = env.reset(seed=env_seed)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                action = act(torch.as_tensor(obs, dtype=torch.float32)[None])
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=RECIPES, required=True)
    parser.add_argument("--dataset", required=True, help="dataset name, under --datasets-dir")
    parser.add_argument("--datasets-dir", type=Path, default=SUITE / "datasets")
    parser.add_argument("--references", type=Path, default=SUITE / "references")
    parser.add_argument("--params", default=str(SUITE / "params.yaml"), help="for the evaluation seeds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--updates", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--sampling", choices=SAMPLINGS, default="replacement")
    parser.add_argument("--gamma", type=float, default=0.99, help="discrete-cql")
    parser.add_argument("--target-update-every", type=int, default=100, help="discrete-cql")
    parser.add_argument("--cql-alpha", type=float, default=1.0, help="discrete-cql")
    args = parser.parse_args()

    torch.set_num_threads(1)
    params = load_params(args.params)
    dataset_dir = args.datasets_dir / args.dataset
    card = dataset.read_card(dataset_dir)
    space_kind, train = RECIPES[args.recipe]
    action_space = card.spaces[1]
    if not isinstance(action_space, space_kind):
        raise SystemExit(f"{args.recipe} needs {space_kind.__name__} actions; {args.dataset}'s are {action_space}")
    if card.env is None:
        raise SystemExit(f"{args.dataset} has no simulator to evaluate on")
    reference = read_reference(args.references, card.env.label, params.evaluate)
    if CEILING not in reference:
        raise SystemExit(f"{args.dataset}: {no_score_reason(card.env.label)}")
    columns = columns_for(args.recipe, dataset_dir, action_space, args.gamma)
    eval_seeds = [episode_seeds(params.evaluate.seed, i)[0] for i in range(params.evaluate.episodes)]
    scores = []
    for seed in args.seeds:
        act = train(columns, action_space, args, seed)
        returns = episode_returns(act, card.env, eval_seeds)
        scores.append(normalized_score(float(np.mean(returns)), reference))
        # Each episode's return: a mean can hide one fall among steady episodes.
        print(f"{args.dataset} {args.recipe} seed {seed}: normalized {scores[-1]:.1f} (returns "
              f"{', '.join(f'{value:.0f}' for value in returns)})", flush=True)
    print(f"{args.dataset} {args.recipe}, {args.sampling}: {np.mean(scores):.1f} ± {np.std(scores):.1f} "
          f"over seeds {args.seeds}")


if __name__ == "__main__":
    exit_on_user_error(main)
