"""benchmarks/ope_validation.py's `--from-results`: earlier runs' candidates validated again together, as the
recorded validations of the full suite are pooled (benchmarks/ope.md), and a later run's estimates in place of the
earlier ones'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def saved_run(out: Path, dataset: str, candidates: list[tuple[str, float, float, float]], behaviour: float) -> Path:
    """An earlier run's OUT/ope_validation.json: per candidate (algo, truth, FQE's estimate, the model's), each
    estimate with an interval of +-1, and the behaviour policy's estimate."""
    out.mkdir(parents=True)
    (out / "ope_validation.json").write_text(json.dumps({
        "candidates": [{"dataset": dataset, "algo": algo, "seed": 0, "budget": 1.0, "truth": truth, "fqe": fqe,
                        "model": model, "intervals": {"fqe": [fqe - 1, fqe + 1], "model": [model - 1, model + 1]}}
                       for algo, truth, fqe, model in candidates],
        "behaviours": {dataset: {"value": behaviour, "low": behaviour - 1, "high": behaviour + 1}}}))
    return out


def without_fqe(out: Path) -> Path:
    """The run at OUT as if it had estimated with the model-based estimator alone (`--estimators model`)."""
    saved = json.loads((out / "ope_validation.json").read_text())
    for c in saved["candidates"]:
        del c["fqe"], c["intervals"]["fqe"]
    (out / "ope_validation.json").write_text(json.dumps(saved))
    return out


def validate_again(*dirs: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.ope_validation", "--from-results", *map(str, dirs),
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_runs_on_other_datasets_are_validated_together_with_the_rule_as_an_estimator(tmp_path):
    # On "a" FQE over-values dqn (true 10) and the model under-values iql; by both, iql stands above the behaviour.
    a = saved_run(tmp_path / "a", "a", [("dqn", 10, 90, 5), ("iql", 60, 70, 40), ("bc", 30, 35, 30)], behaviour=20)
    b = saved_run(tmp_path / "b", "b", [("dqn", 50, 52, 45), ("bc", 40, 41, 38)], behaviour=45)

    result = validate_again(a, b, out=tmp_path / "both")

    assert result.returncode == 0, result.stderr[-3000:]
    both = json.loads((tmp_path / "both" / "ope_validation.json").read_text())
    assert len(both["candidates"]) == 5 and set(both["behaviours"]) == {"a", "b"}
    assert both["summary"]["fqe"]["datasets"]["a"]["regret_at_1"] == 1.0  # picks dqn
    rule = both["summary"]["fqe+model"]
    assert rule["policies"] == 5 and rule["datasets"]["a"]["spearman"] == 1.0  # 5, 40, 30 against 10, 60, 30
    assert rule["mae"] == (5 + 20 + 0 + 5 + 2) / 5
    assert both["selection"]["fqe"]["datasets"]["a"]["kept"] == "dqn-a seed 0 x1"
    # On "b" the rule's lower bound for dqn (44) does not stand above the behaviour's interval (44 to 46).
    assert [d["kept"] for d in both["selection"]["fqe+model"]["datasets"].values()] == ["iql-a seed 0 x1",
                                                                                          "behaviour policy"]
    table = (tmp_path / "both" / "ope_validation.md").read_text()
    assert "| **fqe+model** | **pooled** (regret: median) | 5 |" in table
    assert (tmp_path / "both" / "ope_validation.png").stat().st_size > 0
    # What it writes validates again to the same tables.
    assert validate_again(tmp_path / "both", out=tmp_path / "again").returncode == 0
    assert (tmp_path / "again" / "ope_validation.md").read_text() == table


def test_a_later_runs_estimates_of_the_same_candidates_replace_the_earlier_ones_estimator_by_estimator(tmp_path):
    a = saved_run(tmp_path / "a", "a", [("bc", 30, 35, 30), ("dqn", 10, 90, 5)], behaviour=20)
    b = saved_run(tmp_path / "b", "b", [("bc", 40, 41, 38)], behaviour=45)
    # a run of the model-based estimator alone on "a", after a change to it
    model_again = without_fqe(saved_run(tmp_path / "model-again", "a", [("bc", 30, 0, 29), ("dqn", 10, 0, 12)],
                                        behaviour=20))

    assert validate_again(a, b, model_again, out=tmp_path / "out").returncode == 0

    pooled = json.loads((tmp_path / "out" / "ope_validation.json").read_text())
    assert [(c["dataset"], c["algo"], c["fqe"], c["model"], c["intervals"]["model"]) for c in pooled["candidates"]] == [
        ("a", "bc", 35, 29, [28, 30]), ("a", "dqn", 90, 12, [11, 13]), ("b", "bc", 41, 38, [37, 39])]
    assert pooled["summary"]["fqe+model"]["policies"] == 3


def test_a_candidate_trained_again_replaces_the_earlier_one_whole(tmp_path):
    a = saved_run(tmp_path / "a", "a", [("bc", 30, 35, 30), ("dqn", 10, 90, 5)], behaviour=20)
    retrained = without_fqe(saved_run(tmp_path / "retrained", "a", [("bc", 31, 0, 32)], behaviour=20))

    result = validate_again(a, retrained, out=tmp_path / "out")

    assert result.returncode == 0, result.stderr[-3000:]
    assert "bc-a seed 0 x1: " in result.stderr and "true 31.0, in place of the earlier one, true 30.0" in result.stderr
    pooled = json.loads((tmp_path / "out" / "ope_validation.json").read_text())
    assert [(c["algo"], c["truth"], c.get("fqe"), c["model"]) for c in pooled["candidates"]] == [
        ("bc", 31, None, 32), ("dqn", 10, 90, 5)]
