"""`orl report`: one table and plots across every evaluated run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from common import plots
from common.errors import UserError
from common.run_dir import CURVE_METRIC, RunDir, read_csv, write_json
from dataset_format import read_card
from evaluation.evaluate import normalized_score, reference_path

BEHAVIOUR = "behaviour policy"


def collect_rows(runs_dir: Path, references_dir: Path) -> tuple[list[dict], dict, dict, list[str]]:
    """Rows (one per evaluated run, plus one per dataset for its behaviour policy), curves, returns, and why the
    runs that could not be evaluated were not."""
    rows, curves, returns, seen_datasets, not_evaluated = [], {}, {}, set(), []
    for path in sorted(p for p in Path(runs_dir).iterdir() if p.is_dir()):
        run = RunDir(path)
        if not (run.run_info.is_file() and run.eval_metrics.is_file()):
            continue
        info, metrics = run.info(), json.loads(run.eval_metrics.read_text())
        if "skipped" in metrics:
            not_evaluated.append(f"{path.name}: {metrics['skipped']}")
            continue
        algo = f"{info['algo']} (sampled)" if metrics.get("sampled_actions") else info["algo"]
        rows.append({"env_id": info["env_id"], "dataset": info["dataset"], "algo": algo,
                     "return_mean": metrics["return_mean"], "return_std": metrics["return_std"],
                     "normalized_score": metrics["normalized_score"], "model": info["registered_model"]["uri"]})
        curves[path.name] = read_csv(run.learning_curve)
        returns[path.name] = [r["return"] for r in read_csv(run.eval_returns)]
        if info["dataset"] not in seen_datasets:
            seen_datasets.add(info["dataset"])
            rows.append(_behaviour_row(info["dataset_path"], references_dir, info["env_id"]))
    if not rows:
        raise UserError(f"no evaluated runs under {runs_dir}; run `orl train` and `orl evaluate` first (runs on data "
                        "without a simulator are not evaluated)")
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
                     f"{r['return_mean']:.1f} ± {r['return_std']:.1f} | {r['normalized_score']:.1f} |")
    return "\n".join(lines) + "\n"


def report(runs_dir: str | Path, references_dir: str | Path, out_dir: str | Path) -> Path:
    out_dir = Path(out_dir)
    rows, curves, returns, not_evaluated = collect_rows(Path(runs_dir), Path(references_dir))
    table = markdown_table(rows)
    if not_evaluated:
        table += "\nNot evaluated:\n\n" + "".join(f"- {line}\n" for line in not_evaluated)
    summary = out_dir / "summary.md"
    out_dir.mkdir(parents=True, exist_ok=True)
    summary.write_text("# Offline RL results\n\nNormalized score: 0 = random policy, 100 = expert policy "
                       "(measured on the evaluation seeds; the behaviour policy's on its collection episodes).\n\n"
                       + table + "\n![scores](scores.png)\n![returns](returns.png)\n"
                       "![learning curves](learning_curves.png)\n")
    write_json(out_dir / "scores.json", {f"{r['dataset']}/{r['algo']}": round(r["normalized_score"], 2) for r in rows})
    plots.scores(rows, out_dir / "scores.png")
    plots.return_distributions(returns, {}, out_dir / "returns.png")
    plots.learning_curves(curves, CURVE_METRIC, out_dir / "learning_curves.png")
    print(table, file=sys.stderr)
    return summary

