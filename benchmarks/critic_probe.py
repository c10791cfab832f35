"""What a continuous Q-learner's critics say of the data's actions against its policy's and random ones.

For each policy of CQL or IQL kept by `quality_table.py --keep-checkpoints DIR`, on a sample of logged states and on
the episodes' first states: the mean value its critics (the lower of the twins) give the logged action, the policy's
greedy action (as evaluation acts) and a uniformly random action, and the policy's mean distance from the logged
action in half-widths of the action range. Whether the critics set the data's actions apart from others at all shows
here, where a score cannot.

    python -m benchmarks.critic_probe --dataset benchmarks/mujoco/datasets/hopper-medium \\
        --checkpoints /tmp/diag/ckpt/hopper-medium-cql-seed1 /tmp/diag/ckpt-fixed/hopper-medium-cql-seed0
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import numpy as np

import dataset_format as dataset
from benchmarks.clone_actions import greedy_actions, unit
from common.errors import UserError, exit_on_user_error
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col


def critic_values(module, obs: np.ndarray, actions: np.ndarray) -> float:
    """The mean of the lower of the module's twin critics over the rows, actions in [-1, 1] (where CQL and IQL act)."""
    import torch

    with torch.no_grad():
        values = module.compute_q_values({Col.OBS: torch.from_numpy(obs), Col.ACTIONS: torch.from_numpy(actions)})
    return float(values.mean())


def probe(module, space: gym.spaces.Box, obs: np.ndarray, logged: np.ndarray, rng: np.random.Generator) -> dict:
    """The critics' mean value of the logged, the greedy and uniformly random actions at `obs`, and the greedy
    action's mean distance from the logged one; `logged` in [-1, 1]."""
    greedy = unit(greedy_actions(ModulePolicy(module, space, greedy=True), obs), space).astype(np.float32)
    uniform = rng.uniform(-1.0, 1.0, logged.shape).astype(np.float32)
    return {"logged": critic_values(module, obs, logged), "policy": critic_values(module, obs, greedy),
            "uniform": critic_values(module, obs, uniform), "distance": float(np.abs(greedy - logged).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--checkpoints", type=Path, nargs="+", required=True,
                        help="policies of CQL or IQL, as quality_table.py --keep-checkpoints or orl train keep them")
    parser.add_argument("--rows", type=int, default=50_000, help="logged states sampled (each first state is used)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    card = dataset.read_card(args.dataset)
    observation_space, space = card.spaces
    if len(observation_space.shape) != 1 or not isinstance(space, gym.spaces.Box):
        raise UserError(f"{args.dataset}: this script reads vector observations and continuous actions only")
    table = dataset.read_table(args.dataset, (Col.OBS, Col.ACTIONS, Col.T))
    obs = dataset.column_to_numpy(table[Col.OBS]).astype(np.float32)
    logged = unit(dataset.column_to_numpy(table[Col.ACTIONS]), space).astype(np.float32)
    rng = np.random.default_rng(args.seed)
    samples = {"logged states": rng.choice(len(obs), min(args.rows, len(obs)), replace=False),
               "first states": np.flatnonzero(dataset.column_to_numpy(table[Col.T]) == 0)}
    header = ["policy", "states", "Q(logged action)", "Q(policy's action)", "Q(uniform action)",
              "distance from the logged action"]
    print(f"{card.name}: {len(obs):,} rows, {len(samples['first states']):,} episodes\n")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for path in args.checkpoints:
        module = load_rl_module(path)
        if not hasattr(module, "compute_q_values"):
            raise UserError(f"{path} holds no critics (a policy learner's checkpoint?); give CQL's or IQL's")
        for states, rows in samples.items():
            row = probe(module, space, obs[rows], logged[rows], rng)
            print(f"| {path.parent.name}/{path.name} | {states} | {row['logged']:.1f} | {row['policy']:.1f} | {row['uniform']:.1f} | "
                  f"{row['distance']:.3f} |")


if __name__ == "__main__":
    exit_on_user_error(main)
