"""benchmarks/top_episodes.py: the data of "X % BC", a dataset's episodes with the top share of returns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

import dataset_format as dataset
from dataset_format import Col
from tests.conftest import REPO, assert_user_error


def top_episodes(source: Path, share: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.top_episodes", "--dataset", str(source), "--share", share,
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)


def episodes(path: Path) -> dict[int, np.ndarray]:
    """Each episode's rewards, by eps_id."""
    table = dataset.load_table(path)
    eps_id, rewards = (dataset.column_to_numpy(table[c]) for c in (Col.EPS_ID, Col.REWARDS))
    return {int(i): rewards[eps_id == i] for i in np.unique(eps_id)}


def test_it_keeps_the_episodes_with_the_top_share_of_returns_whole_and_in_order(mixture_dataset, tmp_path):
    out = tmp_path / "top"
    result = top_episodes(mixture_dataset, "0.25", out)
    assert result.returncode == 0, result.stderr[-3000:]

    source = episodes(mixture_dataset)
    best = sorted(source, key=lambda i: -source[i].sum())[:3]  # a quarter of its 12 episodes
    card = dataset.validate(out)
    assert card.episodes == 3 and card.behavior_policy["top_share"] == 0.25
    assert card.source == {"format": "top_episodes", "path": str(mixture_dataset), "share": 0.25}
    kept = dataset.load_table(out)
    rows = np.isin(dataset.column_to_numpy(dataset.load_table(mixture_dataset)[Col.EPS_ID]), best)
    assert kept.equals(dataset.load_table(mixture_dataset).filter(rows))
    assert card.returns["min"] >= max(np.sum(r) for i, r in source.items() if i not in best)


def test_it_refuses_to_write_over_a_dataset_or_keep_no_share(mixture_dataset, tmp_path):
    out = tmp_path / "top"
    assert top_episodes(mixture_dataset, "0.5", out).returncode == 0
    written = {p.name: p.read_bytes() for p in out.iterdir()}

    assert_user_error(top_episodes(mixture_dataset, "0.5", out), str(out), "already exists", prog="top_episodes.py")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == written
    assert_user_error(top_episodes(mixture_dataset, "0", tmp_path / "none"), "--share", prog="top_episodes.py")
