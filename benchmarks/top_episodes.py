"""The data of "X % BC" (Chen et al. 2021, "Decision Transformer"; CORL's `any_percent_bc`): a dataset holding
only the episodes of another whose returns are in its top share, to train BC on with `quality_table.py`.

Where IQL falls below BC on a dataset, BC on the top share tells the two causes apart: if it scores well above
plain BC, the data holds better behaviour that IQL's weights fail to pick out; if not, the data holds too little of
it to be picked out by any weighting.

    python -m benchmarks.top_episodes --dataset benchmarks/mujoco/datasets/hopper-medium-replay --share 0.1 \\
        --out benchmarks/mujoco/datasets/hopper-medium-replay-top10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import dataset_format as dataset
from common.code_version import library_versions
from common.errors import UserError, exit_on_user_error
from dataset_format import Col

# The code the new dataset's bytes depend on.
CODE = ("dataset_format",)
# Rows of one table handed to the writer; the table is cut between episodes.
TABLE_ROWS = 2**16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--share", type=float, required=True, help="the share of episodes kept, in (0, 1]")
    parser.add_argument("--out", type=Path, required=True, help="the new dataset's directory; nothing may be there")
    parser.add_argument("--file-mib", type=int, default=128)
    args = parser.parse_args()
    if not 0 < args.share <= 1:
        parser.error(f"--share must be in (0, 1], got {args.share}")
    out = dataset.refuse_existing(args.out)
    card = dataset.read_card(args.dataset)
    if dataset.stored_as_bytes(card.spaces[0]):
        raise UserError(f"{args.dataset} stores image frames; this script copies vector observations only")
    table = dataset.read_table(args.dataset)
    starts, ends = dataset.episode_bounds(dataset.column_to_numpy(table[Col.EPS_ID]))
    returns, _ = dataset.episode_stats(table)  # in eps_id order, which is the rows' order in a valid dataset
    kept = np.sort(np.argsort(-returns, kind="stable")[:max(1, round(args.share * len(returns)))])
    # The episodes' bytes are the source's: so are the versions of the packages that provided its env.
    providers = {key: value for key, value in card.library_versions.items() if key not in library_versions()}
    new = dataset.DatasetCard.new(
        args.out.name, card.env, card.spaces, card.behavior_policy | {"top_share": args.share, "of": card.name},
        card.seed, len(kept), card.has_action_logp, CODE, providers,
        source={"format": "top_episodes", "path": str(args.dataset), "share": args.share})

    def tables():
        """The kept episodes, in the source's order, in tables of whole episodes."""
        pending, rows = [], 0
        for episode in kept:
            pending.append(np.arange(starts[episode], ends[episode]))
            rows += ends[episode] - starts[episode]
            if rows >= TABLE_ROWS or episode == kept[-1]:
                yield table.take(np.concatenate(pending))
                pending, rows = [], 0

    new = dataset.write_tables(tables(), out, new, args.file_mib * 2**20)
    print(f"[top_episodes] kept {new.episodes} of {card.episodes} episodes, {new.transitions} transitions; return "
          f"{new.returns['mean']:.1f} ± {new.returns['std']:.1f} (min {new.returns['min']:.1f}) where the source's "
          f"is {card.returns['mean']:.1f} ± {card.returns['std']:.1f}", file=sys.stderr)


if __name__ == "__main__":
    exit_on_user_error(main)
