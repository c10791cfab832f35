"""How far the OPE validation's own truths can be trusted: each candidate's true score read again on fresh episodes.

A candidate's true score (benchmarks/ope_validation.py) is a mean over the evaluation episodes, and where the
candidates lie close together, or their returns part widely from one episode to the next, that mean orders them partly
by chance. Here every candidate of an earlier validation run is evaluated again, with its kept checkpoint, on
--episodes new episodes (an evaluation seed the truth did not use), and the first truth is validated against the
second as if it were an estimator: its Spearman and regret@1 per dataset are what an estimator that knew each
candidate's first true score exactly would reach, the ceiling the validation can show; a regret@1 well above 0 says
the first truth's best candidate is not the best. Each fresh reading's standard error is reported beside it.

    M=benchmarks/mujoco
    python -m benchmarks.ope_truth_noise --results benchmarks/results/ope-hopper --params $M/params.yaml \
        --datasets-dir $M/datasets --references $M/references --out OUT

Reads the candidates' checkpoints where ope_validation.py kept them (--candidates; greedy candidates, trained on every
episode); writes OUT/ope_truth_noise.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import dataset_format as dataset
from benchmarks.ope_validation import ROOT, candidate_label, kept_candidate, saved_results
from collectors.config import PolicyConfig
from collectors.rollout import rollout_returns
from common.errors import UserError, exit_on_user_error
from common.ray_runtime import start_ray
from evaluation import ope_validation
from evaluation.references import normalized_score, read_reference
from pipelines.params import load_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True, help="the --out folder of an ope_validation.py run")
    parser.add_argument("--datasets", nargs="+", help="only these of its datasets (default: all of them)")
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--datasets-dir", type=Path, default=ROOT / "datasets")
    parser.add_argument("--references", type=Path, default=ROOT / "references")
    parser.add_argument("--candidates", type=Path, default=ROOT / ".cache" / "ope_candidates")
    parser.add_argument("--episodes", type=int, default=20, help="fresh evaluation episodes per candidate")
    parser.add_argument("--seed", type=int, help="their evaluation seed (default: params.yaml's evaluate.seed + 1)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    params = load_params(args.params)
    evaluate = params.evaluate
    seed = evaluate.seed + 1 if args.seed is None else args.seed
    if args.episodes < 2:
        raise UserError(f"--episodes {args.episodes}: give 2 or more, for a standard error")
    if seed == evaluate.seed:
        raise UserError(f"--seed {seed} is the seed the truths were read on; give another")
    candidates = [c for c in saved_results([args.results])[0] if not args.datasets or c["dataset"] in args.datasets]
    if not candidates:
        raise UserError(f"{args.results / 'ope_validation.json'} holds no candidate"
                        + (f" of {' '.join(args.datasets)}" if args.datasets else ""))
    start_ray(params.ray.num_cpus)
    envs, readings = {}, []
    for c in candidates:
        name, label = c["dataset"], candidate_label(c["algo"], c["dataset"], c["seed"], c["budget"])
        if name not in envs:
            env = dataset.read_card(dataset.locate(args.datasets_dir / name)).env
            envs[name] = env, read_reference(args.references, env.label, evaluate)
        env, reference = envs[name]
        checkpoint = kept_candidate(args.candidates / name, c["algo"], c["seed"], c["budget"]) / "checkpoint"
        if not checkpoint.is_dir():
            raise UserError(f"{checkpoint}: no kept checkpoint of {label}; run benchmarks/ope_validation.py on "
                            f"{name} with --candidates {args.candidates}")
        acting = PolicyConfig(kind="model", model=str(checkpoint), greedy=True)  # as the truth was read
        returns = rollout_returns(env, acting, seed, args.episodes, evaluate.num_workers,
                                  label=f"evaluate {label} again").returns
        scores = np.array([normalized_score(float(r), reference) for r in returns])
        readings.append({"dataset": name, "run": label, "truth": c["truth"], "again": float(scores.mean()),
                         "again_se": float(scores.std(ddof=1) / np.sqrt(len(scores)))})
        print(f"[truth noise] {label}: true {c['truth']:.1f} ({evaluate.episodes} episodes), again "
              f"{readings[-1]['again']:.1f} ± {readings[-1]['again_se']:.1f} ({args.episodes})", file=sys.stderr)
    first = f"the truth ({evaluate.episodes} episodes)"
    summary = ope_validation.validate([{"dataset": r["dataset"], "estimator": first, "estimate": r["truth"],
                                        "truth": r["again"]} for r in readings])
    rows = [f"| {r['run']} | {r['truth']:.1f} | {r['again']:.1f} ± {r['again_se']:.1f} |" for r in readings]
    table = (f"The truth read again on {args.episodes} fresh episodes (evaluation seed {seed}), the first reading "
             "validated against it as an estimator:\n\n" + ope_validation.markdown(summary)
             + f"\n| candidate | true ({evaluate.episodes} episodes) | again (± its standard error) |\n|---|---|---|\n"
             + "\n".join(rows) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ope_truth_noise.md").write_text(table)
    (args.out / "ope_truth_noise.json").write_text(json.dumps(
        {"episodes": args.episodes, "seed": seed, "summary": summary, "candidates": readings}, indent=2))
    print(table)


if __name__ == "__main__":
    exit_on_user_error(main)
