"""benchmarks/ope_truth_noise.py: an OPE validation run's candidates evaluated again on fresh episodes, from the
checkpoints the validation kept, and the first truth validated against the second."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

import dataset_format as dataset
from benchmarks.quality_table import train_ours
from collectors.config import PolicyConfig
from collectors.rollout import rollout_returns
from evaluation import ope_validation
from evaluation.references import normalized_score, reference_path
from pipelines.params import load_params
from tests.conftest import REPO, assert_user_error, run_benchmark
from tests.evaluation.test_evaluate import REFERENCE

pytestmark = pytest.mark.slow  # two tiny trainings and a few CartPole episodes each

DATASET = "cartpole-expert"
SCRIPT = "ope_truth_noise.py"  # how its errors name it, as argparse's do
UPDATES = {"bc": 100, "dqn": 2}  # BC balances the pole a while, DQN barely trained does not


@pytest.fixture(scope="module")
def validated(expert_dataset, tmp_path_factory) -> Path:
    """A project with params, the dataset, references, each candidate's checkpoint kept where ope_validation.py
    keeps it, and that run's results, whose truths are each candidate's evaluation on the params' seed."""
    root = tmp_path_factory.mktemp("truth-noise")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["evaluate"].update(episodes=3, num_workers=0)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.copytree(expert_dataset, root / "datasets" / DATASET)
    loaded = load_params(root / "params.yaml")
    evaluate = loaded.evaluate
    reference = reference_path(root / "references", "CartPole-v1")
    reference.parent.mkdir()
    reference.write_text(json.dumps({**REFERENCE, "seed": evaluate.seed, "episodes": evaluate.episodes}))
    env, candidates = dataset.read_card(root / "datasets" / DATASET).env, []
    for algo, updates in UPDATES.items():
        learner = dataclasses.replace(loaded.algos.get(algo), iterations=1,
                                      updates_per_iteration=updates, hidden_layers=[32])
        checkpoint = root / "candidates" / DATASET / f"{algo}-seed0-x1" / "checkpoint"
        train_ours(algo, learner, root / "datasets" / DATASET, 0, checkpoint)
        candidates.append({"dataset": DATASET, "algo": algo, "seed": 0, "budget": 1.0,
                           "truth": float(np.mean(score(env, checkpoint, evaluate.seed, evaluate.episodes))),
                           "intervals": {}})
    (root / "validation").mkdir()
    (root / "validation" / "ope_validation.json").write_text(json.dumps({"candidates": candidates, "behaviours": {}}))
    return root


def score(env, checkpoint: Path, seed: int, episodes: int) -> list[float]:
    """Each episode's normalized score, greedy, as the validation's truth is read."""
    acting = PolicyConfig(kind="model", model=str(checkpoint), greedy=True)
    return [normalized_score(r, REFERENCE) for r in rollout_returns(env, acting, seed, episodes, 0, "test").returns]


def read_again(root: Path, *args: str) -> subprocess.CompletedProcess:
    return run_benchmark("ope_truth_noise", "--results", root / "validation", "--params", root / "params.yaml",
                         "--datasets-dir", root / "datasets", "--references", root / "references", "--candidates",
                         root / "candidates", *args)


def test_each_candidate_is_scored_again_on_fresh_seeds_and_the_first_truth_validated_against_it(validated):
    first = json.loads((validated / "validation" / "ope_validation.json").read_text())["candidates"]
    result = read_again(validated, "--episodes", "4", "--out", str(validated / "noise"))

    assert result.returncode == 0, result.stderr[-3000:]
    noise = json.loads((validated / "noise" / "ope_truth_noise.json").read_text())
    seed = load_params(validated / "params.yaml").evaluate.seed + 1
    env = dataset.read_card(validated / "datasets" / DATASET).env
    assert noise["seed"] == seed and noise["episodes"] == 4
    again = []
    for c, reading in zip(first, noise["candidates"], strict=True):
        checkpoint = validated / "candidates" / DATASET / f"{c['algo']}-seed0-x1" / "checkpoint"
        scores = score(env, checkpoint, seed, 4)
        assert reading["truth"] == c["truth"]
        assert reading["again"] == pytest.approx(np.mean(scores))
        assert reading["again_se"] == pytest.approx(np.std(scores, ddof=1) / 2)
        again.append(reading["again"])
    truths = [c["truth"] for c in first]
    assert truths[0] > truths[1] and again[0] > again[1]  # BC above barely trained DQN on both readings
    per_dataset = noise["summary"]["the truth (3 episodes)"]["datasets"][DATASET]
    assert per_dataset["spearman"] == ope_validation.spearman(truths, again) == pytest.approx(1.0)
    assert per_dataset["regret_at_1"] == 0.0
    assert "| bc-cartpole-expert seed 0 x1 |" in (validated / "noise" / "ope_truth_noise.md").read_text()


def test_it_refuses_the_truths_own_seed_one_episode_and_a_candidate_without_its_checkpoint(validated, tmp_path):
    seed = load_params(validated / "params.yaml").evaluate.seed
    result = read_again(validated, "--seed", str(seed), "--out", str(tmp_path / "same"))
    assert_user_error(result, f"--seed {seed} is the seed the truths were read on", prog=SCRIPT)
    result = read_again(validated, "--episodes", "1", "--out", str(tmp_path / "one"))
    assert_user_error(result, "--episodes 1: give 2 or more", prog=SCRIPT)

    shutil.rmtree(validated / "candidates" / DATASET / "dqn-seed0-x1")
    result = read_again(validated, "--episodes", "2", "--out", str(tmp_path / "lost"))
    assert_user_error(result, "dqn-seed0-x1/checkpoint: no kept checkpoint of dqn-cartpole-expert seed 0 x1",
                      prog=SCRIPT)
    assert not (tmp_path / "lost").exists()
