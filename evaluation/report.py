"""`orl report`: one table and plots across every evaluated run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common import plots
from common.errors import UserError
from common.run_dir import CURVE_METRIC, RunDir, read_csv, write_json
from dataset_format import read_card
from evaluation import ope_validation
from evaluation.config import SELECT_BY
from evaluation.references import no_score_reason, normalized_score, reference_path
from evaluation.selection import BEHAVIOUR as BEHAVIOUR_ESTIMATE
from evaluation.selection import Interval, policy_name, rule_name

BEHAVIOUR = "behaviour policy"
# The results table's place when no run was evaluated in an env (data without a simulator): the estimates remain.
NO_EVALUATED_RUN = "No run was evaluated in an environment; see the off-policy estimates below."


def collect_rows(runs_dir: Path, references_dir: Path) -> tuple[list[dict], dict, dict, list[str]]:
    """Rows (one per evaluated run, plus one per dataset for its behaviour policy), the learning curves of every
    trained run, returns, and why the runs that could not be evaluated were not."""
    rows, curves, returns, seen_datasets, not_evaluated = [], {}, {}, set(), []
    for path in sorted(p for p in Path(runs_dir).iterdir() if p.is_dir()):
        run = RunDir(path)
        if not run.run_info.is_file():
            continue
        if run.learning_curve.is_file():
            curves[path.name] = read_csv(run.learning_curve)
        if not run.eval_metrics.is_file():
            continue
        info, metrics = run.info(), json.loads(run.eval_metrics.read_text())
        if "skipped" in metrics:
            not_evaluated.append(f"{path.name}: {metrics['skipped']}")
            continue
        algo = f"{info['algo']} (sampled)" if metrics.get("sampled_actions") else info["algo"]
        rows.append({"env_id": info["env_id"], "dataset": info["dataset"], "algo": algo,
                     "return_mean": metrics["return_mean"], "return_std": metrics["return_std"],
                     "normalized_score": metrics.get("normalized_score"), "model": info["registered_model"]["uri"]})
        returns[path.name] = [r["return"] for r in read_csv(run.eval_returns)]
        if info["dataset"] not in seen_datasets:
            seen_datasets.add(info["dataset"])
            rows.append(_behaviour_row(info["dataset_path"], references_dir, info["env_id"]))
    return rows, curves, returns, not_evaluated


def _behaviour_row(dataset_path: str, references_dir: Path, env_id: str) -> dict:
    card = read_card(dataset_path)
    path = reference_path(references_dir, env_id)
    if not path.is_file():
        raise UserError(f"{path} is missing; run `orl reference` (or dvc repro) first")
    reference = json.loads(path.read_text())
    return {"env_id": env_id, "dataset": card.name, "algo": BEHAVIOUR,
            "return_mean": card.returns["mean"], "return_std": card.returns["std"],
            "normalized_score": normalized_score(card.returns["mean"], reference), "model": ""}


def markdown_table(rows: list[dict]) -> str:
    lines = ["| env | dataset | policy | return (mean ± std) | normalized score |", "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["env_id"], r["dataset"], r["algo"] != BEHAVIOUR, r["algo"])):
        lines.append(f"| {r['env_id']} | {r['dataset']} | {r['algo']} | "
                     f"{r['return_mean']:.1f} ± {r['return_std']:.1f} | {_cell(r['normalized_score'], 'n/a')} |")
    unscored = sorted({r["env_id"] for r in rows if r["normalized_score"] is None})
    return "\n".join(lines) + "\n" + "".join(f"\nn/a: {no_score_reason(env)}.\n" for env in unscored)


def off_policy_estimates(runs_dir: Path) -> tuple[list[dict], list[dict], dict[str, Interval]]:
    """A row per run with `orl ope` estimates (and its true score where it was evaluated), a point per (evaluated
    run, defined estimate) for the validation, and each dataset's behaviour policy estimate."""
    rows, points, behaviours = [], [], {}
    for path in sorted(p for p in Path(runs_dir).iterdir() if p.is_dir()):
        run = RunDir(path)
        if not run.ope_metrics.is_file():
            continue
        ope = json.loads(run.ope_metrics.read_text())
        evaluated = json.loads(run.eval_metrics.read_text()) if run.eval_metrics.is_file() else {}
        # A true score of the policy estimated: a softmax version of it (`orl ope --temperature`) was not evaluated.
        same_policy = ope.get("policy") == policy_name(evaluated.get("sampled_actions", False))
        truth = evaluated.get("normalized_score") if same_policy else None
        # A number, or why an estimator that applies gave none (e.g. "did not converge").
        estimates = {name: e.get("value", e.get("status")) for name, e in ope["estimates"].items()}
        rows.append({"run": path.name, "dataset": ope["dataset"], "units": ope["units"], "truth": truth, **estimates})
        if truth is not None and ope["units"] == "normalized score":
            points += [{"dataset": ope["dataset"], "estimator": name, "estimate": value, "truth": truth,
                        "run": path.name, "ci_low": ope["estimates"][name]["ci_low"],
                        "ci_high": ope["estimates"][name]["ci_high"]}
                       for name, value in estimates.items() if isinstance(value, float)]
            if BEHAVIOUR_ESTIMATE in ope:  # the same for every run on the dataset
                b = ope[BEHAVIOUR_ESTIMATE]
                behaviours[ope["dataset"]] = Interval(b["value"], b["ci_low"], b["ci_high"])
    return rows, points, behaviours


def ope_section(rows: list[dict], summary: dict, selection: dict) -> str:
    estimators = list(dict.fromkeys(k for r in rows for k in r if k not in ("run", "dataset", "units", "truth")))
    lines = [f"| run | dataset | true score | {' | '.join(estimators)} |", "|---|---|---|" + "---|" * len(estimators)]
    for r in rows:
        cells = [_cell(r.get(name)) for name in estimators]
        lines.append(f"| {r['run']} | {r['dataset']} | {_cell(r['truth'])} | {' | '.join(cells)} |")
    text = ("\n## Off-policy estimates\n\nEach policy's return estimated from its dataset alone (`orl ope`; "
            "normalized scores, or returns for data without an env; - where an estimator does not apply; \"did not "
            "converge\" where FQE's fit failed; \"unreliable\" where the importance weights collapsed, docs/ope.md), "
            "against its true score from `orl evaluate`.\n\n" + "\n".join(lines) + "\n")
    if summary:
        if rule_name(SELECT_BY) in summary:
            text += (f"\n`{rule_name(SELECT_BY)}` is what `orl select` reads of a run by default: the lowest of the "
                     f"{' and '.join(SELECT_BY)} estimates, in the span of their intervals (docs/ope.md).\n")
        text += "\n" + ope_validation.markdown(summary) + "\n![estimates against true scores](ope.png)\n"
    if selection:
        text += ("\n### `orl select`'s rule, checked against the true scores\n\nWhat the rule keeps on each dataset, "
                 "from the estimates' intervals alone: the run with the highest lower bound, or the behaviour policy "
                 "where that bound does not stand above the behaviour's interval, by each estimator and by "
                 f"{rule_name(SELECT_BY)} together, `orl select`'s default (docs/ope.md); its regret against "
                 "the best of the behaviour policy and the runs estimated, with a number or without.\n\n"
                 + ope_validation.selection_markdown(selection))
    return text


def _cell(value: float | str | None, missing: str = "-") -> str:
    if value is None or isinstance(value, str):
        return value or missing
    return f"{value:.1f}"


def report(runs_dir: str | Path, references_dir: str | Path, out_dir: str | Path) -> Path:
    """The summary, scores and plots of every evaluated run, and the off-policy estimates of every estimated one:
    on data without a simulator, the estimates are all there is."""
    out_dir = Path(out_dir)
    rows, curves, returns, not_evaluated = collect_rows(Path(runs_dir), Path(references_dir))
    estimate_rows, points, behaviour_estimates = off_policy_estimates(Path(runs_dir))
    if not rows and not estimate_rows:
        raise UserError(f"nothing to report under {runs_dir}: no run was evaluated or estimated; run `orl train`, "
                        "then `orl evaluate` (or `orl ope` for data without a simulator)")
    table = markdown_table(rows) if rows else NO_EVALUATED_RUN + "\n"
    if not_evaluated:
        table += "\nNot evaluated:\n\n" + "".join(f"- {line}\n" for line in not_evaluated)
    points = ope_validation.with_rule_points(points)  # `orl select`'s default rule, validated as an estimator
    validation = ope_validation.validate(points)
    behaviour_truths = {r["dataset"]: r["normalized_score"] for r in rows
                        if r["algo"] == BEHAVIOUR and r["normalized_score"] is not None}
    run_truths: dict[str, dict[str, float]] = {}  # every estimated run's true score, whether estimates came or not
    for r in estimate_rows:
        if r["truth"] is not None and r["units"] == "normalized score":
            run_truths.setdefault(r["dataset"], {})[r["run"]] = r["truth"]
    selection = ope_validation.validate_selection(points, {
        name: (estimate, behaviour_truths[name]) for name, estimate in behaviour_estimates.items()
        if name in behaviour_truths}, run_truths)
    summary = out_dir / "summary.md"
    out_dir.mkdir(parents=True, exist_ok=True)
    summary.write_text("# Offline RL results\n\nNormalized score: 0 = the floor reference (the random policy unless "
                       "params.yaml's `references:` says otherwise), 100 = the ceiling (measured on the evaluation "
                       "seeds; the behaviour policy's on its collection episodes).\n\n"
                       + table + "\n![scores](scores.png)\n![returns](returns.png)\n"
                       "![learning curves](learning_curves.png)\n"
                       + (ope_section(estimate_rows, validation, selection) if estimate_rows else ""))
    write_json(out_dir / "scores.json", {f"{r['dataset']}/{r['algo']}": round(r["normalized_score"], 2)
                                         for r in rows if r["normalized_score"] is not None})
    write_json(out_dir / "ope.json", validation)
    write_json(out_dir / "selection.json", selection)
    if points:
        plots.estimates_against_truth(points, out_dir / "ope.png")
    else:
        plots.message("no off-policy estimates of evaluated runs (orl ope)", out_dir / "ope.png")
    if rows:
        plots.scores(rows, out_dir / "scores.png")
        plots.return_distributions(returns, {}, out_dir / "returns.png")
    else:
        for plot in ("scores.png", "returns.png"):
            plots.message(NO_EVALUATED_RUN, out_dir / plot)
    plots.learning_curves(curves, CURVE_METRIC, out_dir / "learning_curves.png")
    print(table, file=sys.stderr)
    return summary
