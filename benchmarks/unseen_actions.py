"""Why plain offline DQN collapses on expert data: how its greedy policy, and the Q-values it acts on, treat the
actions the data never takes, beside conservative DQN and IQL trained on the same data.

For each learner (hyper-parameters from the suite's params.yaml, times `--updates-scale`) and training seed, on every
state of the dataset: how often the greedy action differs from the data's, and the mean of the largest Q-value among
the other actions minus the data action's (above 0: an action the data never takes looks better). IQL's greedy
action is its policy's; its Q-values are its twin critics' minimum. Prints a markdown table.

    python -m benchmarks.unseen_actions --datasets cartpole-expert --algos dqn cql_dqn --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import torch

import dataset_format as dataset
from benchmarks.quality_table import SUITE, train_ours
from common.errors import exit_on_user_error
from common.ray_runtime import start_ray
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from pipelines.params import load_params


def q_values(module, obs: torch.Tensor) -> torch.Tensor:
    """Every action's Q-value: DQN's Q-network, or IQL's twin critics' minimum."""
    with torch.no_grad():
        q = module.compute_q_values({"obs": obs})
    return q["qf_preds"] if isinstance(q, dict) else q


def measure(checkpoint: Path, obs: np.ndarray, actions: np.ndarray, action_space) -> tuple[float, float]:
    """(share of states where the greedy action is not the data's, mean best-other-Q minus data-action Q)."""
    module = load_rl_module(checkpoint)
    greedy, _ = ModulePolicy(module, action_space, greedy=True).act(obs, [], None)
    q = q_values(module, torch.as_tensor(obs)).numpy().astype(np.float64)
    rows = np.arange(len(actions))
    taken = q[rows, actions]
    q[rows, actions] = -np.inf
    return float(np.mean(greedy != actions)), float(np.mean(q.max(axis=1) - taken))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["cartpole-expert"])
    parser.add_argument("--algos", nargs="+", default=["dqn", "cql_dqn", "iql"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--updates-scale", type=int, default=1)
    args = parser.parse_args()

    params = load_params(SUITE / "params.yaml")
    start_ray(params.ray.num_cpus)
    rows = ["| dataset | learner | greedy action not the data's | best other Q - data action's Q |", "|---|---|---|---|"]
    for name in args.datasets:
        dataset_dir = SUITE / "datasets" / name
        arrays, action_space = dataset.load_arrays(dataset_dir), dataset.read_card(dataset_dir).spaces[1]
        obs, actions = arrays[Col.OBS].astype(np.float32), arrays[Col.ACTIONS].astype(np.int64)
        for algo in args.algos:
            base = params.algos.get(algo)
            algo_params = dataclasses.replace(base, iterations=base.iterations * args.updates_scale)
            measured = []
            for seed in args.seeds:
                with tempfile.TemporaryDirectory() as tmp:
                    train_ours(algo, algo_params, dataset_dir, seed, Path(tmp) / "checkpoint")
                    measured.append(measure(Path(tmp) / "checkpoint", obs, actions, action_space))
            disagree, gap = np.array(measured).T
            rows.append(f"| {name} | {algo} | {100 * disagree.mean():.1f} % ± {100 * disagree.std():.1f} | "
                        f"{gap.mean():+.2f} ± {gap.std():.2f} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    exit_on_user_error(main)
