"""The model-based estimator with and without its halt where the ensemble's networks part (`ope.model_halt_quantile`),
on the candidates `ope_validation.py` keeps: their true scores against both estimates, per dataset.

The dynamics are fitted once per dataset, as `orl ope` fits them (params.yaml's `ope` settings, every logged
episode); each candidate kept with a greedy true score (`truth.json`) is rolled out with the halt as fitted and
without one. Spearman, regret@1 and MAE as `ope_validation.py` reports them (evaluation/ope_validation.py), and the
share of rollouts that halted.

    python -m benchmarks.ope_model_halt --params benchmarks/suite/params.yaml \\
        --datasets-dir benchmarks/suite/datasets --references benchmarks/suite/references \\
        --datasets cartpole-random acrobot-random
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gymnasium as gym
import numpy as np

import dataset_format as dataset
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from evaluation import ope_validation
from evaluation.model_based import fit_dynamics, rollout_returns
from evaluation.ope import actor, episode_horizon, fit_progress, logged_episodes
from evaluation.references import normalized_score, read_reference
from pipelines.params import load_params

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", required=True)
    parser.add_argument("--datasets-dir", type=Path, required=True)
    parser.add_argument("--references", type=Path, required=True)
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--candidates", type=Path, default=ROOT / ".cache" / "ope_candidates")
    args = parser.parse_args()

    params = load_params(args.params)
    points = []
    for name in args.datasets:
        location = dataset.locate(args.datasets_dir / name)
        card = dataset.read_card(location)
        reference = read_reference(args.references, card.env.label, params.evaluate)
        episodes = logged_episodes(location, card)
        horizon, discrete = episode_horizon(card.env, episodes), isinstance(card.spaces[1], gym.spaces.Discrete)
        model = fit_dynamics(episodes, card.spaces[1].n if discrete else None, params.ope,
                             fit_progress(name, "model network", "loss"))
        limits = {"halt": model.disagreement_limit, "no halt": np.inf}
        print(f"[{name}] halt where the networks part by more than {model.disagreement_limit:.3f}; a halt at step 0 "
              f"counts {model.halt_value(0):.1f}, past the longest episode {model.halt_floor:.1f}", flush=True)
        starts = episodes.arrays[Col.OBS][episodes.starts]
        for kept in sorted(p.parent for p in (args.candidates / name).glob("*/truth.json")):
            truth = json.loads((kept / "truth.json").read_text())["truth"]
            policy = ModulePolicy(load_rl_module(kept / "checkpoint"), card.spaces[1], greedy=True)
            line = []
            for label, limit in limits.items():
                model.disagreement_limit = limit
                returns, halted = rollout_returns(model, actor(policy, discrete, params.ope.seed), starts, horizon,
                                                  params.ope.gamma)
                estimate = normalized_score(float(returns.mean()), reference)
                points.append({"dataset": name, "run": kept.name, "estimator": f"model, {label}",
                               "estimate": estimate, "ci_low": estimate, "ci_high": estimate, "truth": truth})
                line.append(f"{label} {estimate:.1f} ({halted.mean():.0%} halted)")
            print(f"[{name}] {kept.name}: true {truth:.1f}; " + ", ".join(line), flush=True)
    print(ope_validation.markdown(ope_validation.validate(points)))


if __name__ == "__main__":
    main()
