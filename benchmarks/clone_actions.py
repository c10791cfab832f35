"""Where BC's clones act, against the data's own actions: how often each joint is at its bound, for the data and for
the greedy actions of BC over a plain Gaussian, over a tanh-squashed one and as a deterministic tanh(mu) fitted by
squared error (`algos.bc.action_distribution`), at one training seed or several.

Trains BC with each distribution and seed on the dataset with params.yaml's settings (its `per_dataset` values and
`--set` included), or reads the modules kept in `--checkpoints` by an earlier run (one folder per clone); then acts
greedily on every logged observation, as evaluation acts. Printed, for the data and each clone: the share of rows with
some joint at its bound (within 1 % of the action range's half-width), that share per joint, the mean magnitude of the
actions and the clone's mean distance from the logged action, both in half-widths; with `--references`, each clone's
normalized score on params.yaml's evaluation episodes; each pair of clones' mean distance from each other.

    python -m benchmarks.clone_actions --params benchmarks/mujoco/params.yaml \\
        --dataset benchmarks/mujoco/datasets/hopper-medium-replay --checkpoints /tmp/bc-hopper-medium-replay
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from pathlib import Path

import gymnasium as gym
import numpy as np

import dataset_format as dataset
from benchmarks.quality_table import field_value
from collectors.config import PolicyConfig
from collectors.rollout import rollout_returns
from common.errors import UserError, exit_on_user_error
from common.ray_runtime import start_ray
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from evaluation.references import normalized_score, read_reference
from pipelines.params import load_params
from training.algorithms.batch_columns import unit_actions
from training.config import ACTION_DISTRIBUTIONS

# Rows through a policy at once.
CHUNK_ROWS = 65_536
# An action within this share of the half-width from a bound counts as at the bound.
AT_BOUND = 0.01


def unit(actions: np.ndarray, space: gym.spaces.Box) -> np.ndarray:
    """Actions rescaled from the space's bounds to [-1, 1], without the margin the squashed clone is trained with."""
    return unit_actions(actions, space.low, space.high, margin=0.0)


def continuous_card(path: Path) -> tuple[dataset.DatasetCard, gym.spaces.Box]:
    """The dataset's card and action space; refuses image observations and discrete actions."""
    card = dataset.read_card(path)
    observation_space, action_space = card.spaces
    if len(observation_space.shape) != 1 or not isinstance(action_space, gym.spaces.Box):
        raise UserError(f"{path}: this script reads vector observations and continuous actions only")
    return card, action_space


def logged_rows(path: Path, space: gym.spaces.Box, *more: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """The dataset's observations (float32), its actions in [-1, 1] and its columns `more`, as numpy arrays."""
    table = dataset.read_table(path, (Col.OBS, Col.ACTIONS, *more))
    return (dataset.column_to_numpy(table[Col.OBS]).astype(np.float32),
            unit(dataset.column_to_numpy(table[Col.ACTIONS]), space),
            {column: dataset.column_to_numpy(table[column]) for column in more})


def greedy_actions(policy: ModulePolicy, obs: np.ndarray) -> np.ndarray:
    return np.concatenate([policy.act(obs[first:first + CHUNK_ROWS], [], None)[0]
                           for first in range(0, len(obs), CHUNK_ROWS)])


def summary(actions: np.ndarray, logged: np.ndarray) -> dict:
    """Shares at the bounds of actions in [-1, 1], their mean magnitude and their mean distance from the logged ones
    (also in [-1, 1])."""
    at_bound = np.abs(actions) >= 1.0 - AT_BOUND
    return {"any_joint": float(at_bound.any(axis=1).mean()), "per_joint": at_bound.mean(axis=0).tolist(),
            "magnitude": float(np.abs(actions).mean()), "distance": float(np.abs(actions - logged).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", required=True)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--checkpoints", type=Path, required=True,
                        help="where the trained clones are kept, one folder per clone: trained here if absent")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--distributions", nargs="+", choices=ACTION_DISTRIBUTIONS, default=list(ACTION_DISTRIBUTIONS))
    parser.add_argument("--references", type=Path,
                        help="the references folder of the dataset's env: each clone is evaluated and its score shown")
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE", type=field_value,
                        help="a BC hyper-parameter's value instead of params.yaml's (e.g. lr=0.0003)")
    args = parser.parse_args()
    params = load_params(args.params)
    card, action_space = continuous_card(args.dataset)
    if args.references and card.env is None:
        raise UserError(f"{args.dataset} has no simulator to evaluate the clones on; leave out --references")
    reference = read_reference(args.references, card.env.label, params.evaluate) if args.references else None
    bc = dataclasses.replace(params.algos.get("bc").for_dataset(card.name), **dict(args.set))
    obs, logged, _ = logged_rows(args.dataset, action_space)
    checkpoints = {(name, seed): args.checkpoints / f"{name}-seed{seed}"
                   for name in args.distributions for seed in args.seeds}
    if reference or not all(path.exists() for path in checkpoints.values()):
        start_ray(params.ray.num_cpus)
    rows = {"data": summary(logged, logged)}
    clones = {}
    for (name, seed), path in checkpoints.items():
        if not path.exists():
            from benchmarks.quality_table import train_ours

            train_ours("bc", dataclasses.replace(bc, action_distribution=name), args.dataset, seed, path)
        label = f"BC, {name}, seed {seed}"
        clones[label] = unit(greedy_actions(ModulePolicy(load_rl_module(path), action_space, greedy=True), obs),
                             action_space)
        rows[label] = summary(clones[label], logged)
        if reference:
            policy = PolicyConfig(kind="model", model=str(path), greedy=True)
            returns = rollout_returns(card.env, policy, params.evaluate.seed, params.evaluate.episodes,
                                      params.evaluate.num_workers, label=f"evaluate {label}").returns
            rows[label]["score"] = normalized_score(float(np.mean(returns)), reference)
    settings = ", ".join(f"{key}={value}" for key, value in args.set)
    print(f"{card.name}: {len(logged):,} rows; BC with lr {bc.lr}, {bc.iterations * bc.updates_per_iteration:,} "
          f"updates{f' (--set {settings})' if settings else ''}\n")
    header = ["actions", "some joint at a bound", *(f"joint {j}" for j in range(logged.shape[1])), "mean magnitude",
              "mean distance from the logged action", *(["normalized score"] if reference else [])]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name, row in rows.items():
        cells = [name, f"{row['any_joint']:.3f}", *(f"{share:.3f}" for share in row["per_joint"]),
                 f"{row['magnitude']:.3f}", f"{row['distance']:.3f}"]
        if reference:
            cells.append(f"{row['score']:.1f}" if "score" in row else "")  # the data's row has none
        print("| " + " | ".join(cells) + " |")
    for (first, first_actions), (second, second_actions) in itertools.combinations(clones.items(), 2):
        print(f"\n{first} and {second}: mean distance {np.abs(first_actions - second_actions).mean():.3f}")


if __name__ == "__main__":
    exit_on_user_error(main)
