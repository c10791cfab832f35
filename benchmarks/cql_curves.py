"""Our CQL's learning curves beside d3rlpy's, from `quality_table.py` runs: where two CQLs that score apart train.

Each learner logs its own names for the same quantities; this plots the four both log, one line per training seed,
ours solid and d3rlpy's dashed, against thousands of gradient updates:
- the conservative weight (the learned multiplier of the penalty: ours `conservative_weight`, d3rlpy's `alpha`);
- the conservative gap, the logsumexp of Q over sampled actions less Q on the data's actions, averaged over the twin
  critics (ours `conservative_gap`; d3rlpy logs its penalty, from which the gap is solved);
- the entropy temperature (ours `alpha_value`, d3rlpy's `temp`);
- the actor's loss, temperature * log-density less the smaller critic's Q at the policy's action (`policy_loss`,
  `actor_loss`).

    python -m benchmarks.cql_curves --results /tmp/cql-hmr-0 /tmp/d3cql-hmr-0 --dataset hopper-medium-replay \\
        --out benchmarks/results/cql-hopper-medium-replay/curves.png
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ray.rllib.core.learner.learner import POLICY_LOSS_KEY

from common.errors import UserError, exit_on_user_error
from training.algorithms.offline_cql import CONSERVATIVE_GAP, CONSERVATIVE_WEIGHT

OURS, D3RLPY = "cql", "d3rlpy-cql"
ENTROPY_TEMPERATURE = "alpha_value"  # the name RLlib 2.60's CQL learner logs it under, a literal there
# d3rlpy's CQLConfig defaults, which d3rlpy_runner.py leaves and `--d3rlpy-set` may change: its logged penalty is
# summed over `n_critics` critics, each `alpha * conservative_weight * (gap - alpha_threshold)`.
D3RLPY_DEFAULTS = {"n_critics": 2, "alpha_threshold": 10.0}


def d3rlpy_gap(row: dict, cell: dict) -> float:
    """The mean gap over d3rlpy's critics, solved from its logged penalty and weight."""
    config = D3RLPY_DEFAULTS | {key: cell["overrides"][key] for key in D3RLPY_DEFAULTS if key in cell["overrides"]}
    weight = row["alpha"] * cell["hyper_parameters"]["min_q_weight"]  # d3rlpy_runner's `conservative_weight`
    return row["conservative_loss"] / (config["n_critics"] * weight) + config["alpha_threshold"]


# Panel title -> each learner's value of it, from one logged row and its cell's records in quality.json. Ours logs
# the first two only where it learns the weight (`lagrangian_threshold` set); without, they are left blank.
PANELS = {
    "conservative weight": {OURS: lambda row, cell: row.get(CONSERVATIVE_WEIGHT, math.nan),
                            D3RLPY: lambda row, cell: row["alpha"]},
    "conservative gap": {OURS: lambda row, cell: row.get(CONSERVATIVE_GAP, math.nan), D3RLPY: d3rlpy_gap},
    "entropy temperature": {OURS: lambda row, cell: row[ENTROPY_TEMPERATURE], D3RLPY: lambda row, cell: row["temp"]},
    "actor loss": {OURS: lambda row, cell: row[POLICY_LOSS_KEY], D3RLPY: lambda row, cell: row["actor_loss"]},
}


def curves(results: list[Path], dataset: str) -> dict[str, dict[str, list[tuple[int, dict]]]]:
    """Per learner, per training seed: (updates, the panels' values) at each logged iteration."""
    found: dict[str, dict[str, list[tuple[int, dict]]]] = {OURS: {}, D3RLPY: {}}
    for directory in results:
        path = directory / "quality.json"
        try:
            entry = json.loads(path.read_text())[dataset]
        except FileNotFoundError:
            raise UserError(f"{path} not found: pass a directory `quality_table.py --out` wrote") from None
        except KeyError:
            raise UserError(f"{path} has no dataset {dataset!r}; pass the --dataset it measured") from None
        for learner in (OURS, D3RLPY):
            for seed, rows in entry.get("learner_metrics", {}).get(learner, {}).items():
                cell = {key: entry[key][learner] for key in ("hyper_parameters", "overrides")}
                updates = cell["hyper_parameters"]["updates_per_iteration"]
                found[learner][seed] = [(row["iteration"] * updates, {title: value[learner](row, cell)
                                                                      for title, value in PANELS.items()})
                                        for row in rows]
    missing = [learner for learner in (OURS, D3RLPY) if not found[learner]]
    if missing:
        raise UserError(f"no learner metrics of {', '.join(missing)} on {dataset} in {', '.join(map(str, results))}; "
                        f"pass the runs of both learners")
    return found


def plot(found: dict, dataset: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.6))
    for learner, style in ((OURS, "-"), (D3RLPY, "--")):
        for index, (seed, rows) in enumerate(sorted(found[learner].items())):
            for ax, title in zip(axes, PANELS):
                ax.plot([updates / 1000 for updates, _ in rows], [values[title] for _, values in rows], style,
                        color=f"C{index}", label=f"{learner} seed {seed}")
    for ax, title in zip(axes, PANELS):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("updates (thousands)")
    axes[0].set_yscale("log")
    fig.suptitle(f"CQL on {dataset}: ours (solid) and d3rlpy's (dashed)", fontsize=11)
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=8, ncol=4, loc="lower center")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, nargs="+", required=True,
                        help="directories `quality_table.py --out` wrote, with our CQL's and d3rlpy's cells")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args()
    found = curves(args.results, args.dataset)
    plot(found, args.dataset, args.out)
    print(f"[cql curves] {len(found[OURS])} seeds of ours, {len(found[D3RLPY])} of d3rlpy's -> {args.out}")


if __name__ == "__main__":
    exit_on_user_error(main)
