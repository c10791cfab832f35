"""IQL's advantage weights on a dataset against its episodes' returns: do the weights that pick the actions IQL
clones favour the better episodes, or are they set by the noise of Q - V?

Trains IQL on the dataset with params.yaml's settings (its `per_dataset` values included), or reads the module of
`--checkpoint` where one is there already; then, over every logged transition, the advantage A = min(Q1, Q2)(s, a) -
V(s) of the trained networks (the critics, not their Polyak targets, which a saved module does not keep) and the
weight IQL's policy loss gives it, exp(beta * A) capped as in training. Printed: A's spread, the weights' effective
share of the rows ((sum w)^2 / (n sum w^2), as training logs it), the Spearman correlation of an episode's mean
advantage with its return, and, by the episodes' returns in five bins (quartiles, the top quarter split at the top
10 %), each bin's share of the rows, its share of the weight and its mean advantage.

    python -m benchmarks.iql_advantages --params benchmarks/mujoco/params.yaml \\
        --dataset benchmarks/mujoco/datasets/hopper-medium-replay --checkpoint /tmp/iql-hopper-medium-replay
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from scipy.stats import spearmanr

import dataset_format as dataset
from common.errors import UserError, exit_on_user_error
from common.ray_runtime import start_ray
from common.trained_policy import load_rl_module
from dataset_format import Col
from pipelines.params import load_params
from training.algorithms.batch_columns import network_observations
from training.algorithms.offline_iql import MAX_ADVANTAGE_WEIGHT
from training.algorithms.registry import ALGORITHMS
from training.algorithms.train_batches import BatchPlan

# Rows through the networks at once.
CHUNK_ROWS = 65_536
# The upper edges of the bins of episodes by return, as quantiles.
RETURN_QUANTILES = (0.25, 0.5, 0.75, 0.9, 1.0)


def advantages(module, table, batches: BatchPlan) -> np.ndarray:
    """min(Q1, Q2)(s, a) - V(s) of IQL's trained networks for each row of `table` (vector observations), made a
    batch as training makes it (`batches`, IQL's BatchPlan: Box actions rescaled to the tanh policy's range)."""
    columns = network_observations(batches.to_train_batch(table, **batches.kwargs), None)
    obs, actions = (columns[f"{DEFAULT_MODULE_ID}/{key}"] for key in (Columns.OBS, Columns.ACTIONS))
    out = []
    with torch.no_grad():
        for first in range(0, table.num_rows, CHUNK_ROWS):
            batch = {Columns.OBS: torch.tensor(obs[first:first + CHUNK_ROWS]),  # copies: the arrays are read-only
                     Columns.ACTIONS: torch.tensor(actions[first:first + CHUNK_ROWS])}
            q = module._q_of_taken(batch, module.qf_encoder, module.qf)
            if module.twin_q:
                q = torch.min(q, module._q_of_taken(batch, module.qf_twin_encoder, module.qf_twin))
            out.append((q - module.compute_values({Columns.OBS: batch[Columns.OBS]}).reshape(q.shape)).numpy())
    return np.concatenate(out)


def summary(advantage: np.ndarray, eps_id: np.ndarray, rewards: np.ndarray, beta: float) -> dict:
    """The weights' spread and where they go, by the episodes' returns (see the module's docstring)."""
    weights = np.minimum(np.exp(beta * advantage.astype(np.float64)), MAX_ADVANTAGE_WEIGHT)
    starts, ends = dataset.episode_bounds(eps_id)
    lengths = ends - starts
    returns = np.add.reduceat(rewards.astype(np.float64), starts)
    bins, low = [], float(returns.min())
    for quantile in RETURN_QUANTILES:
        high = float(np.quantile(returns, quantile))
        episodes = (returns >= low) & (returns <= high) if not bins else (returns > low) & (returns <= high)
        rows = np.repeat(episodes, lengths)
        bins.append({"returns": [low, high], "row_share": float(rows.mean()),
                     "weight_share": float(weights[rows].sum() / weights.sum()),
                     "mean_advantage": float(advantage[rows].mean())})
        low = high
    return {
        "advantage_quantiles": dict(zip(("1%", "50%", "99%"), np.percentile(advantage, [1, 50, 99]).tolist())),
        "advantage_std": float(advantage.std()),
        "capped_share": float((weights >= MAX_ADVANTAGE_WEIGHT).mean()),
        "effective_share": float(weights.sum() ** 2 / (len(weights) * np.square(weights).sum())),
        "spearman_episode_advantage_return": float(spearmanr(np.add.reduceat(advantage, starts) / lengths,
                                                             returns).statistic),
        "bins": bins,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", required=True)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="where the trained IQL is kept: trained here if nothing is there, else read")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    params = load_params(args.params)
    card = dataset.read_card(args.dataset)
    if len(card.spaces[0].shape) != 1:
        raise UserError(f"{args.dataset}: its observations are not vectors; this script reads vector observations only")
    iql = params.algos.get("iql").for_dataset(card.name)
    if not args.checkpoint.exists():
        from benchmarks.quality_table import train_ours

        start_ray(params.ray.num_cpus)
        train_ours("iql", iql, args.dataset, args.seed, args.checkpoint)
    table = dataset.read_table(args.dataset)
    advantage = advantages(load_rl_module(args.checkpoint), table, ALGORITHMS["iql"].batches(iql, card.spaces[1]))
    result = summary(advantage, dataset.column_to_numpy(table[Col.EPS_ID]),
                     dataset.column_to_numpy(table[Col.REWARDS]), iql.beta)
    quantiles = ", ".join(f"{key} {value:.2f}" for key, value in result["advantage_quantiles"].items())
    print(f"{card.name}, IQL with beta {iql.beta} and expectile {iql.expectile}: advantage std "
          f"{result['advantage_std']:.2f} (quantiles {quantiles}); weights capped on {result['capped_share']:.1%} "
          f"of rows, effective share {result['effective_share']:.3f}; Spearman of an episode's mean advantage with "
          f"its return {result['spearman_episode_advantage_return']:.2f}\n")
    print("| episodes returning | share of rows | share of the weight | mean advantage |\n|---|---|---|---|")
    for row in result["bins"]:
        print(f"| {row['returns'][0]:.1f} to {row['returns'][1]:.1f} | {row['row_share']:.3f} | "
              f"{row['weight_share']:.3f} | {row['mean_advantage']:.2f} |")


if __name__ == "__main__":
    exit_on_user_error(main)
