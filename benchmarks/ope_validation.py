"""Off-policy evaluation against the truth: how well each estimator ranks and scores policies it never ran.

For every dataset, candidate policies of spread-out quality: every learner that fits the dataset, on each training
seed, stopped after a share of params.yaml's iterations and after all of them. Each candidate is scored in the
environment on the pipeline's evaluation seeds (its true normalized score) and estimated from the dataset alone by
every estimator that applies, with params.yaml's `ope` settings, as `orl ope` does. Then, per estimator: Spearman
rank correlation per dataset and pooled, regret@1 and mean absolute error; and what `orl select`'s rule keeps on
each dataset, against the behaviour policy (evaluation/ope_validation.py). The rule's own reading of the estimates
(`fqe+model`: the lower of the two) is validated as an estimator beside them.

    python -m benchmarks.ope_validation --datasets cartpole-random cartpole-expert cartpole-learned
    python -m benchmarks.ope_validation --from-results OUT_A OUT_B --out OUT  # earlier runs, validated together
    python -m benchmarks.ope_validation --datasets cartpole-random --estimators model --out OUT_M  # after a change
    python -m benchmarks.ope_validation --from-results OUT_A OUT_M --out OUT  # OUT_A's FQE, OUT_M's model

Reads the quick tour's params.yaml, datasets/ and references/ by default (`make pipeline` makes them); writes
OUT/ope_validation.{md,json,png}. Each candidate's checkpoint and true score are kept under --candidates and reused
while its dataset and hyper-parameters are the same, so that a change to the estimators is checked by estimating
alone. The model-based estimator's dynamics are fitted once per dataset, for every candidate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import dataset_format as dataset
from benchmarks.quality_table import CONTINUOUS_ALGOS, DISCRETE_ALGOS, train_ours
from collectors.config import PolicyConfig
from collectors.rollout import rollout_returns
from common import plots
from common.errors import UserError, exit_on_user_error
from common.ray_runtime import start_ray
from common.trained_policy import ModulePolicy, load_rl_module
from evaluation import ope_validation
from dataset_format import Col
from evaluation.config import ESTIMATORS, MODEL, EvaluateConfig
from evaluation.estimators import Episodes
from evaluation.model_based import has_dynamics
from evaluation.ope import estimate_policy, fit_model, logged_episodes, split_episodes, undefined_estimators
from evaluation.references import CEILING, no_score_reason, normalized_score, read_reference
from evaluation.selection import BEHAVIOUR, Interval
from pipelines.params import load_params

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--datasets", nargs="+", help="dataset names under --datasets-dir")
    source.add_argument("--from-results", type=Path, nargs="+", metavar="DIR",
                        help="validate again, together, the candidates earlier runs wrote to DIR/ope_validation.json "
                             "(their truths, estimates and intervals; nothing is trained or estimated): to pool "
                             "runs on other datasets, or after a change to the validation itself; a later DIR's "
                             "estimates of the same candidate replace an earlier one's, estimator by estimator (all "
                             "of them, where the candidate was trained again)")
    parser.add_argument("--datasets-dir", type=Path, default=ROOT / "datasets")
    parser.add_argument("--references", type=Path, default=ROOT / "references")
    parser.add_argument("--algos", nargs="+", help="learners to train candidates with (default: every one that fits)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds per learner and budget")
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.1, 1.0],
                        help="shares of each learner's params.yaml iterations to stop at (one candidate each)")
    parser.add_argument("--temperature", type=float,
                        help="validate softmax versions of the candidates (orl ope --temperature): evaluated and "
                             "estimated sampling from softmax(logits / T)")
    parser.add_argument("--train-fraction", type=float,
                        help="train the candidates on this seeded share of each dataset's episodes and fit and "
                             "estimate OPE on the others (default: both on every episode, as the pipeline does)")
    parser.add_argument("--estimators", nargs="+", choices=ESTIMATORS,
                        help="validate only these (default: every estimator the dataset allows); FQE and doubly "
                             "robust alone skip the model-based estimator's fits")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--candidates", type=Path, default=ROOT / ".cache" / "ope_candidates",
                        help="where each candidate's checkpoint and true score are kept for the next run")
    args = parser.parse_args()
    candidates, behaviours = saved_results(args.from_results) if args.from_results else estimated_candidates(args)
    write_results(candidates, behaviours, args.out)


def estimated_candidates(args: argparse.Namespace) -> tuple[list[dict], dict[str, Interval]]:
    """Every candidate of `args.datasets`, trained (or read back from `args.candidates`), scored in its env and
    estimated: its truth, each estimate and interval; and each dataset's behaviour policy estimate."""
    params = load_params(args.params)
    start_ray(params.ray.num_cpus)
    candidates, behaviours = [], {}
    for name in args.datasets:
        location = dataset.locate(args.datasets_dir / name)
        card = dataset.read_card(location)
        if card.env is None:
            raise UserError(f"{name} has no simulator to score its candidates on; leave it out of --datasets")
        reference = read_reference(args.references, card.env.label, params.evaluate)
        if CEILING not in reference:  # the truth and the estimates are normalized scores
            raise UserError(f"{name}: {no_score_reason(card.env.label)}")
        episodes = logged_episodes(location, card)
        training_data, cache = Path(location.uri), args.candidates / name
        if args.train_fraction:
            cache = args.candidates / f"{name}-train{args.train_fraction:g}"
            training_data, episodes = training_split(location, card, episodes, args.train_fraction,
                                                     params.ope.seed, cache / "dataset")
        training_card = dataset.read_card(training_data)
        fit, held_out = split_episodes(episodes, params.ope)
        estimators = [e for e in args.estimators or ESTIMATORS if e not in undefined_estimators(card)]
        action_space = card.spaces[1]
        discrete = isinstance(action_space, gym.spaces.Discrete)
        algos = DISCRETE_ALGOS if discrete else CONTINUOUS_ALGOS
        dynamics = (fit_model(fit, action_space, params.ope, name)
                    if MODEL in estimators and has_dynamics(fit)  # else estimate_policy says why
                    else None)  # one fit serves every candidate: the dynamics do not depend on the policy
        for algo in [a for a in algos if not args.algos or a in args.algos]:
            for seed in args.seeds:
                for budget in args.budgets:
                    base = params.algos.get(algo).for_dataset(name)
                    algo_params = dataclasses.replace(base, iterations=max(1, round(base.iterations * budget)))
                    label = candidate_label(algo, name, seed, budget)
                    started = time.monotonic()
                    kept = kept_candidate(cache, algo, seed, budget)
                    acting = PolicyConfig(kind="model", model=str(kept / "checkpoint"), greedy=args.temperature is None,
                                          temperature=args.temperature)  # as `orl ope` estimates it
                    truth = trained_candidate(kept, training_card, algo, algo_params, training_data, seed, acting,
                                              reference, params.evaluate, label)
                    policy = ModulePolicy(load_rl_module(kept / "checkpoint"), action_space, acting.greedy,
                                          acting.temperature)
                    estimates = estimate_policy(policy, card, fit, held_out, reference, params.ope, estimators,
                                                label=label, dynamics=dynamics)
                    b = estimates[BEHAVIOUR]  # the same for every candidate of the dataset
                    behaviours[name] = Interval(b["value"], b["ci_low"], b["ci_high"])
                    found = {k: e for k, e in estimates["estimates"].items() if "value" in e}
                    candidates.append({"dataset": name, "algo": algo, "seed": seed, "budget": budget,
                                       "truth": truth, **{k: e["value"] for k, e in found.items()},
                                       "intervals": {k: [e["ci_low"], e["ci_high"]] for k, e in found.items()}})
                    print(f"[ope validation] {label}: true {truth:.1f}, "
                          + ", ".join(f"{k} {e['value']:.1f}" for k, e in found.items())
                          + f" ({time.monotonic() - started:.0f}s)", file=sys.stderr, flush=True)
    return candidates, behaviours


def candidate_label(algo: str, dataset_name: str, seed: int, budget: float) -> str:
    return f"{algo}-{dataset_name} seed {seed} x{budget:g}"


def kept_candidate(cache: Path, algo: str, seed: int, budget: float) -> Path:
    """Where a candidate of the dataset cached at `cache` keeps its checkpoint and true scores."""
    return cache / f"{algo}-seed{seed}-x{budget:g}"


def saved_results(dirs: list[Path]) -> tuple[list[dict], dict[str, Interval]]:
    """The candidates and behaviour estimates that earlier runs wrote to each DIR/ope_validation.json. A later DIR's
    estimates of a candidate an earlier one holds replace those of the same estimators, so that a change to one
    estimator is validated by running it alone and pooling its run after the earlier ones; a candidate trained again
    (another true score) replaces the earlier one whole."""
    candidates, behaviours = {}, {}
    for directory in dirs:
        path = directory / "ope_validation.json"
        try:
            saved = json.loads(path.read_text())
            for c in saved["candidates"]:
                label = candidate_label(c["algo"], c["dataset"], c["seed"], c["budget"])
                earlier = candidates.setdefault(label, {**c, "intervals": {}})
                if earlier["truth"] != c["truth"]:  # trained again: another policy, whose estimates are all these
                    print(f"[ope validation] {label}: {path}'s, true {c['truth']:.1f}, in place of the earlier "
                          f"one, true {earlier['truth']:.1f}", file=sys.stderr)
                    earlier = candidates[label] = {**c, "intervals": {}}
                earlier.update({k: v for k, v in c.items() if k != "intervals"})
                earlier["intervals"].update(c["intervals"])
            behaviours |= {name: Interval(**b) for name, b in saved["behaviours"].items()}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{path}: not the results of an OPE validation run ({e}); give the --out folder of "
                            "one") from e
    return list(candidates.values()), behaviours


def write_results(candidates: list[dict], behaviours: dict[str, Interval], out: Path) -> None:
    """OUT/ope_validation.{md,json,png}: each estimator's and `orl select`'s rule's validation over the candidates
    (and the candidates themselves, for `--from-results`)."""
    points, truths = [], {}
    for c in candidates:
        run = candidate_label(c["algo"], c["dataset"], c["seed"], c["budget"])
        truths.setdefault(c["dataset"], {})[run] = c["truth"]  # also where no estimator gave a number
        points += [{"dataset": c["dataset"], "run": run, "estimator": k, "estimate": c[k], "ci_low": low,
                    "ci_high": high, "truth": c["truth"]} for k, (low, high) in c["intervals"].items()]
    points = ope_validation.with_rule_points(points)  # `orl select`'s default rule, validated as an estimator
    summary = ope_validation.validate(points)
    # The behaviour policy's true score is its logged mean return, which its estimate is.
    selection = ope_validation.validate_selection(points, {name: (b, b.value) for name, b in behaviours.items()},
                                                  truths)
    table = ope_validation.markdown(summary) + "\n" + ope_validation.selection_markdown(selection)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ope_validation.md").write_text(table)
    (out / "ope_validation.json").write_text(json.dumps({
        "summary": summary, "selection": selection, "candidates": candidates,
        "behaviours": {name: dataclasses.asdict(interval) for name, interval in behaviours.items()}}, indent=2))
    plots.estimates_against_truth(points, out / "ope_validation.png")
    print(table)


def training_split(location: dataset.Location, card: dataset.DatasetCard, episodes: Episodes, fraction: float,
                   seed: int, out: Path) -> tuple[Path, Episodes]:
    """(a dataset at `out` of a seeded `fraction` of the episodes, for the candidates to train on; the other
    episodes, for OPE): OPE then reads no transition the candidates learned from, as a validation split would."""
    order = np.random.default_rng(seed).permutation(len(episodes))
    count = round(fraction * len(episodes))
    if not 0 < count < len(episodes):
        raise UserError(f"--train-fraction {fraction} leaves no episode of {card.name}'s {len(episodes)} for "
                        "training or for OPE")
    training = np.sort(order[:count])
    if not out.exists():
        table = dataset.read_table(location)
        ids = pa.array(episodes.arrays[Col.EPS_ID][episodes.starts[training]])
        table = table.filter(pc.is_in(table[Col.EPS_ID], value_set=ids))
        dataset.write_tables([table], out, dataclasses.replace(card, name=f"{card.name}-train{fraction:g}",
                                                               episodes=count), file_bytes=2**26)
    return out, episodes.select(np.sort(order[count:]))


def trained_candidate(kept: Path, card: dataset.DatasetCard, algo: str, algo_params, dataset_dir: Path, seed: int,
                      acting: PolicyConfig, reference: dict, evaluate: EvaluateConfig, label: str) -> float:
    """The candidate's true normalized score, acting as `acting` says, with its checkpoint under `kept`: trained
    and evaluated, or read back where a run before kept the same candidate of the same data."""
    data = {k: getattr(card, k) for k in ("seed", "episodes", "transitions", "returns", "behavior_policy")}
    key = json.loads(json.dumps({"dataset": data, "algo": algo, "params": dataclasses.asdict(algo_params),
                                 "seed": seed, "evaluate": dataclasses.asdict(evaluate)}))  # as a record reads back
    record = kept / ("truth.json" if acting.greedy else f"truth-softmax-{acting.temperature:g}.json")
    kept_records = {r: json.loads(r.read_text()) for r in kept.glob("truth*.json")}
    if not any(r["key"] == key for r in kept_records.values()):  # not trained as asked
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
        train_ours(algo, algo_params, dataset_dir, seed, kept / "checkpoint")
    elif record in kept_records:
        return kept_records[record]["truth"]
    returns = rollout_returns(card.env, acting, evaluate.seed, evaluate.episodes, evaluate.num_workers,
                              label=f"evaluate {label}").returns
    truth = normalized_score(float(np.mean(returns)), reference)
    record.write_text(json.dumps({"key": key, "truth": truth}, indent=2))
    return truth


if __name__ == "__main__":
    exit_on_user_error(main)
