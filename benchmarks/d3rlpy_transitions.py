"""Do d3rlpy's learners train on the transitions ours do? d3rlpy's transitions of a vector dataset, as
d3rlpy_runner.py's `load` builds them (each next observation the episode's next row's observation), against the
dataset's Parquet rows, which our learners read as they are (`new_obs` their next observation).

Run in d3rlpy's virtualenv; prints one JSON line: the rows, d3rlpy's transitions (it leaves out each episode's last
step where the time limit ended it: that step has no next row), the largest difference of any observation, action,
reward or next observation, and the rows whose terminal flag differs. A terminal step's next observation is left out
of the comparison: d3rlpy's is zeros, ours the last state; the TD target masks both.

    .venv-d3rlpy/bin/python benchmarks/d3rlpy_transitions.py --dataset benchmarks/mujoco/datasets/hopper-medium-replay
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from d3rlpy_runner import image_stack, load, numpy_column  # beside this file, run as a script there

COLUMNS = ["obs", "actions", "rewards", "new_obs", "terminateds"]


def rows(dataset_dir: Path, card: dict) -> dict[str, np.ndarray]:
    """The dataset's columns that one-step learners read, in row order (`numpy_column`'s arrays)."""
    table = pa.concat_tables(pq.read_table(dataset_dir / f["path"], columns=COLUMNS) for f in card["files"])
    return {name: numpy_column(table, name) for name in COLUMNS}


def compare(dataset_dir: Path) -> dict:
    """d3rlpy's transitions, drawn by its own transition picker, against the rows: see the module's docstring."""
    card = json.loads((dataset_dir / "_card.json").read_text())
    if image_stack(card) is not None:
        raise SystemExit(f"{dataset_dir} holds stacked frames; this compares vector datasets")
    _, _, data = load(dataset_dir)  # its own read of the rows, d3rlpy's side of the comparison
    ours = rows(dataset_dir, card)
    largest, flags_differ, first_row = 0.0, 0, 0
    for episode in data.episodes:  # in row order, each of its steps a row
        for index in range(episode.transition_count):
            theirs, row = data.transition_picker(episode, index), first_row + index
            pairs = [(theirs.observation, ours["obs"][row]), (theirs.action, ours["actions"][row]),
                     (theirs.reward, ours["rewards"][row])]
            if not theirs.terminal:
                pairs.append((theirs.next_observation, ours["new_obs"][row]))
            largest = max(largest, *(float(np.abs(np.asarray(a, np.float64) - b).max()) for a, b in pairs))
            flags_differ += bool(theirs.terminal) != bool(ours["terminateds"][row])
        first_row += episode.size()
    if first_row != len(ours["obs"]):
        raise SystemExit(f"d3rlpy's episodes hold {first_row} steps, {dataset_dir} {len(ours['obs'])} rows")
    return {"rows": first_row, "transitions": data.transition_count, "largest_difference": largest,
            "terminal_flags_differ": flags_differ}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True)
    print(json.dumps(compare(parser.parse_args().dataset)))


if __name__ == "__main__":
    main()
