"""What a continuous Q-learner's critics say of the data's actions against its policy's and random ones, and of its
policy's own episodes against the returns they got.

For each policy of CQL or IQL kept by `quality_table.py --keep-checkpoints DIR`, on a sample of logged states and on
the episodes' first states: the mean value its critics (the lower of the twins) give the logged action, the policy's
greedy action (as evaluation acts) and a uniformly random action, and the policy's mean distance from the logged
action in half-widths of the action range. Then along `--episodes` greedy episodes in the dataset's env: the critics'
mean value of each step's action against the discounted return got from that step on (a time limit's cut leaves the
rest out), over every step, the first and the last few. Whether the critics set the data's actions apart, how far they
overvalue the policy's own, and whether they see its falls coming, shows here, where a score cannot.

`--d3rlpy-weights FILE ...` probes d3rlpy's CQLs too, as `quality_table.py --keep-checkpoints` keeps their trained
weights: each is read into a copy of the first checkpoint's module, which must be a CQL of the same sizes; d3rlpy's
greedy action, tanh of its Gaussian's mean, is the one ours takes.

    python -m benchmarks.critic_probe --dataset benchmarks/mujoco/datasets/hopper-medium \\
        --checkpoints /tmp/diag/ckpt/hopper-medium-cql-seed1 /tmp/diag/ckpt-fixed/hopper-medium-cql-seed0 \\
        --d3rlpy-weights /tmp/diag/ckpt/hopper-medium-d3rlpy-cql-seed2.pt
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from benchmarks.clone_actions import continuous_card, greedy_actions, logged_rows, unit
from benchmarks.cql_one_update import copy_networks
from common.envs import make_env
from common.errors import UserError, exit_on_user_error
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from training.algorithms.batch_columns import returns_to_go

# The steps of each episode the critics' values and the returns got are averaged over: whether the critics see an
# episode's end coming shows in its last steps.
LAST_STEPS = 10
STRETCHES = {"every step": lambda series: series, "first step": lambda series: series[:1],
             f"last {LAST_STEPS} steps": lambda series: series[-LAST_STEPS:]}


def critic_values(module, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """The lower of the module's twin critics at each row, actions in [-1, 1] (where CQL and IQL act)."""
    with torch.no_grad():
        return module.compute_q_values({Col.OBS: torch.as_tensor(obs, dtype=torch.float32),
                                        Col.ACTIONS: torch.as_tensor(actions, dtype=torch.float32)}).numpy()


def probe(policy: ModulePolicy, obs: np.ndarray, logged: np.ndarray, rng: np.random.Generator) -> dict:
    """The critics' mean value of the logged, the greedy and uniformly random actions at `obs`, and the greedy
    action's mean distance from the logged one; `logged` in [-1, 1]."""
    greedy = unit(greedy_actions(policy, obs), policy.space)
    uniform = rng.uniform(-1.0, 1.0, logged.shape)
    return {"logged": float(critic_values(policy.module, obs, logged).mean()),
            "policy": float(critic_values(policy.module, obs, greedy).mean()),
            "uniform": float(critic_values(policy.module, obs, uniform).mean()),
            "distance": float(np.abs(greedy - logged).mean())}


def along_episodes(policy: ModulePolicy, env: gym.Env, episodes: int, seed: int, gamma: float) -> dict:
    """The critics' mean value of the greedy policy's actions along its episodes from seeds `seed`, `seed` + 1, ...,
    and the mean discounted return got from each step on, over each of `STRETCHES`."""
    values, returns = [], []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        observations, actions, rewards, done = [], [], [], False
        while not done:
            action = greedy_actions(policy, obs[None])[0]
            observations.append(obs)
            actions.append(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(reward)
            done = terminated or truncated
        values.append(critic_values(policy.module, np.array(observations), unit(np.array(actions), policy.space)))
        episode_end = np.zeros(len(rewards), dtype=bool)
        episode_end[-1] = True
        returns.append(returns_to_go(np.array(rewards), episode_end, gamma))
    return {"steps": sum(map(len, values)) / episodes,
            **{f"{where} {what}": float(np.mean(np.concatenate([part(each) for each in series])))
               for where, part in STRETCHES.items() for what, series in (("value", values), ("return", returns))}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--checkpoints", type=Path, nargs="+", required=True,
                        help="policies of CQL or IQL, as quality_table.py --keep-checkpoints or orl train keep them")
    parser.add_argument("--d3rlpy-weights", type=Path, nargs="+", default=[], metavar="FILE",
                        help="d3rlpy's trained CQLs, as quality_table.py --keep-checkpoints keeps them (.pt)")
    parser.add_argument("--rows", type=int, default=50_000, help="logged states sampled (each first state is used)")
    parser.add_argument("--seed", type=int, default=0, help="draws the logged states and the uniform actions")
    parser.add_argument("--episodes", type=int, default=10, help="greedy episodes in the dataset's env (0: none)")
    parser.add_argument("--eval-seed", type=int, default=1_000_000,
                        help="the first episode's seed (the suites' params.yaml `evaluate.seed`)")
    parser.add_argument("--gamma", type=float, default=0.99, help="the learner's discount (params.yaml's `gamma`)")
    args = parser.parse_args()
    card, space = continuous_card(args.dataset)
    if args.episodes and card.env is None:
        raise UserError(f"{args.dataset} has no simulator to play episodes in; add --episodes 0")
    obs, logged, more = logged_rows(args.dataset, space, Col.T)
    rng = np.random.default_rng(args.seed)
    samples = {"logged states": rng.choice(len(obs), min(args.rows, len(obs)), replace=False),
               "first states": np.flatnonzero(more[Col.T] == 0)}
    policies = {}
    for path in args.checkpoints:
        module = load_rl_module(path)
        if not hasattr(module, "compute_q_values"):
            raise UserError(f"{path} holds no critics (a policy learner's checkpoint?); give CQL's or IQL's")
        policies[f"{path.parent.name}/{path.name}"] = ModulePolicy(module, space, greedy=True)
    for path in args.d3rlpy_weights:
        module = copy.deepcopy(next(iter(policies.values())).module)
        copy_networks(module, torch.load(path), path)
        policies[f"{path.parent.name}/{path.name}"] = ModulePolicy(module, space, greedy=True)
    header = ["policy", "states", "Q(logged action)", "Q(policy's action)", "Q(uniform action)",
              "distance from the logged action"]
    print(f"{card.name}: {len(obs):,} rows, {len(samples['first states']):,} episodes\n")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name, policy in policies.items():
        for states, rows in samples.items():
            row = probe(policy, obs[rows], logged[rows], rng)
            print(f"| {name} | {states} | {row['logged']:.1f} | {row['policy']:.1f} | {row['uniform']:.1f} | "
                  f"{row['distance']:.3f} |")
    if not args.episodes:
        return
    header = ["policy", "steps an episode",
              *(f"{what}, {where}" for where in STRETCHES for what in ("Q", "return got"))]
    print(f"\n{args.episodes} greedy episodes in {card.env.label} from seed {args.eval_seed}, returns discounted by "
          f"{args.gamma}\n\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    env = make_env(card.env)
    for name, policy in policies.items():
        row = along_episodes(policy, env, args.episodes, args.eval_seed, args.gamma)
        print(f"| {name} | {row['steps']:.0f} | " + " | ".join(f"{row[f'{where} {what}']:.1f}" for where in STRETCHES
                                                         for what in ("value", "return")) + " |")
    env.close()


if __name__ == "__main__":
    exit_on_user_error(main)
