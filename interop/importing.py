"""`orl datasets import`: data made elsewhere becomes one of our datasets, written and validated like collected
data, its card naming the source. Re-importing the same source gives the same bytes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

import dataset_format as dataset
from common.envs import EnvSpec, make_env, provider_versions
from dataset_format import Col
from interop.config import ImportConfig
from interop.logs import read_log
from interop.source import Source

# The code an imported dataset's bytes depend on: dvc.yaml's import stage declares the same folders.
IMPORT_CODE = ("common", "dataset_format", "interop")
# Episodes are gathered into tables of about this many rows before they are written.
TABLE_ROWS = 2**16


def _providers(env: EnvSpec) -> dict[str, str]:
    made = make_env(env)
    try:
        return provider_versions(made)
    finally:
        made.close()


def import_dataset(name: str, config: ImportConfig, out: str | Path, file_bytes: int) -> dataset.DatasetCard:
    """Imports the source `config` names to `out` (a local directory or s3:// prefix)."""
    out = dataset.refuse_existing(out)
    source = _read(config)
    card = dataset.DatasetCard.new(
        name, config.env, (source.observation_space, source.action_space),
        {"kind": "logged", "description": config.behavior_policy or source.behavior}, None, source.episode_count,
        source.with_logp, IMPORT_CODE, _providers(config.env) if config.env else {},
        source={"format": config.format, "path": config.source, **source.metadata})
    card = dataset.write_tables(_tables(source.episodes, card.schema()), out, card, file_bytes)
    where = f"env {card.env_id}" if card.env_id else "no simulator"
    print(f"[import {name}] wrote {card.episodes} episodes, {card.transitions} transitions in {len(card.files)} "
          f"files to {out} ({where}); return {card.returns['mean']:.1f} ± {card.returns['std']:.1f}",
          file=sys.stderr)
    return card


def _read(config: ImportConfig) -> Source:
    if config.format == "minari":
        from interop.minari_io import read_minari  # the `minari` extra, imported only for Minari data

        return read_minari(config)
    return read_log(config)


def _tables(episodes, schema: pa.Schema) -> Iterator[pa.Table]:
    """Episodes numbered 0, 1, ... with their steps, gathered into tables of whole episodes."""
    pending: list[dict[str, np.ndarray]] = []
    rows = 0
    for eps_id, episode in enumerate(episodes):
        length = len(episode[Col.REWARDS])
        pending.append({Col.EPS_ID: np.full(length, eps_id, dtype=np.int64),
                        Col.T: np.arange(length, dtype=np.int32), **episode})
        rows += length
        if rows >= TABLE_ROWS:
            yield _table(pending, schema)
            pending, rows = [], 0
    if pending:
        yield _table(pending, schema)


def _table(episodes: list[dict[str, np.ndarray]], schema: pa.Schema) -> pa.Table:
    return dataset.transitions_table({f.name: np.concatenate([e[f.name] for e in episodes]) for f in schema}, schema)
