"""`orl report` over a runs/ directory laid out as `orl train` and `orl evaluate` leave it."""

from __future__ import annotations

import json
import re

import pytest

from common.errors import UserError
from common.run_dir import RunDir, write_csv, write_json
from dataset_format import read_card
from evaluation.report import BEHAVIOUR, NO_EVALUATED_RUN, report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REFERENCE = {"env_id": "CartPole-v1", "seed": 1_000_000, "episodes": 20,
             "random": {"mean": 20.0}, "expert": {"mean": 520.0}}


def fake_run(runs, name: str, algo: str, dataset_dir, returns: list[float], sampled: bool = False,
             evaluated: bool = True) -> RunDir:
    """A run directory with the files `orl train` (and, if evaluated, `orl evaluate`) write."""
    run = RunDir(runs / name)
    card = read_card(dataset_dir)
    write_json(run.run_info, {
        "algo": algo, "policy_is_distribution": True, "dataset": card.name, "dataset_path": str(dataset_dir),
        "env_id": card.env_id, "mlflow_run_id": "0" * 32, "mlflow_experiment_id": "1",
        "registered_model": {"name": f"CartPole-v1-{algo}", "version": "1", "uri": f"models:/CartPole-v1-{algo}/1"},
    })
    write_csv(run.learning_curve, [{"iteration": i, "loss": 1.0 / i, "time_s": 0.5 * i} for i in range(1, 4)])
    if evaluated:
        mean = sum(returns) / len(returns)
        std = (sum((r - mean) ** 2 for r in returns) / len(returns)) ** 0.5
        write_json(run.eval_metrics, {"return_mean": mean, "return_std": std, "return_min": min(returns),
                                      "return_max": max(returns), "normalized_score": (mean - 20.0) / 5.0,
                                      "episodes": len(returns), "sampled_actions": sampled})
        write_csv(run.eval_returns, [{"episode": i, "return": r} for i, r in enumerate(returns)])
    return run


@pytest.fixture
def references(tmp_path):
    path = tmp_path / "references"
    path.mkdir()
    (path / "CartPole-v1.json").write_text(json.dumps(REFERENCE))
    return path


def test_report_writes_the_table_scores_and_plots(expert_dataset, references, tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs, "bc-cartpole-expert", "bc", expert_dataset, [500.0, 480.0, 520.0], sampled=True)
    fake_run(runs, "cql-cartpole-expert", "cql", expert_dataset, [120.0, 100.0])
    fake_run(runs, "dqn-cartpole-expert", "dqn", expert_dataset, [], evaluated=False)  # trained, not evaluated
    (runs / "notes.txt").write_text("not a run")

    summary = report(runs, references, tmp_path / "reports")

    assert summary == tmp_path / "reports" / "summary.md"
    card = read_card(expert_dataset)
    behaviour_score = 100 * (card.returns["mean"] - 20.0) / 500.0
    table = [line for line in summary.read_text().splitlines() if line.startswith("| CartPole-v1 |")]
    # One row per evaluated run plus the behaviour policy's, which comes first within its dataset.
    behaviour = (f"| CartPole-v1 | cartpole-expert | {BEHAVIOUR} | {card.returns['mean']:.1f} ± "
                 f"{card.returns['std']:.1f} | {behaviour_score:.1f} |")
    assert table == [
        behaviour,
        "| CartPole-v1 | cartpole-expert | bc (sampled) | 500.0 ± 16.3 | 96.0 |",
        "| CartPole-v1 | cartpole-expert | cql | 110.0 ± 10.0 | 18.0 |",
    ]
    scores = json.loads((tmp_path / "reports" / "scores.json").read_text())
    assert scores == {"cartpole-expert/bc (sampled)": 96.0, "cartpole-expert/cql": 18.0,
                      f"cartpole-expert/{BEHAVIOUR}": round(behaviour_score, 2)}
    for image in ("scores.png", "returns.png", "learning_curves.png"):
        data = (tmp_path / "reports" / image).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
        assert f"({image})" in summary.read_text()


def test_report_with_nothing_evaluated_or_estimated_is_a_user_error(expert_dataset, references, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(UserError, match=f"nothing to report under {re.escape(str(runs))}"):
        report(runs, references, tmp_path / "reports")
    fake_run(runs, "bc-cartpole-expert", "bc", expert_dataset, [], evaluated=False)
    with pytest.raises(UserError, match=r"run `orl train`, then `orl evaluate` \(or `orl ope` for data without a"):
        report(runs, references, tmp_path / "reports")
    assert not (tmp_path / "reports").exists()


def test_data_without_a_simulator_is_reported_by_its_estimates(expert_dataset, references, tmp_path):
    """Runs that no env can evaluate (`orl evaluate` skips them) still have `orl ope`'s estimates, in returns."""
    runs = tmp_path / "runs"
    for algo, value in (("bc", 41.5), ("dqn", 57.25)):
        run = fake_run(runs, f"{algo}-shop-log", algo, expert_dataset, [], evaluated=False)
        write_json(run.eval_metrics, {"skipped": "dataset shop-log has no simulator to evaluate in"})
        write_json(run.ope_metrics, {"dataset": "shop-log", "units": "return", "estimates": {
            "fqe": {"value": value, "ci_low": value - 2, "ci_high": value + 2},
            "wpdis": {"status": "unreliable", "effective_episodes": 1.5}}})

    summary = report(runs, references, tmp_path / "reports").read_text()

    assert NO_EVALUATED_RUN in summary and "| CartPole-v1 |" not in summary
    assert "- bc-shop-log: dataset shop-log has no simulator to evaluate in" in summary
    estimates = [line for line in summary.splitlines() if "-shop-log | shop-log |" in line]
    assert estimates == ["| bc-shop-log | shop-log | - | 41.5 | unreliable |",
                         "| dqn-shop-log | shop-log | - | 57.2 | unreliable |"]
    assert json.loads((tmp_path / "reports" / "scores.json").read_text()) == {}
    for image in ("scores.png", "returns.png", "learning_curves.png", "ope.png"):
        assert (tmp_path / "reports" / image).read_bytes().startswith(PNG_MAGIC)


def test_the_report_checks_the_selection_rule_against_the_true_scores(expert_dataset, references, tmp_path):
    """Evaluated runs with `orl ope` estimates: the report says what `orl select`'s rule keeps on the dataset and
    its regret, in the summary and in selection.json. An estimate of another policy than the one evaluated (a
    softmax version, `orl ope --temperature`) gets no true score, and the check leaves it out."""
    runs = tmp_path / "runs"
    behaviour = {"value": 99.0, "ci_low": 98.0, "ci_high": 100.0}  # the expert dataset's logged returns
    for algo, returns, interval, policy in (("bc", [500.0], (95.0, 99.5), "greedy"),
                                            ("dqn", [120.0], (60.0, 80.0), "greedy"),
                                            ("marwil", [500.0], (100.5, 101.0), "softmax at temperature 1")):
        run = fake_run(runs, f"{algo}-cartpole-expert", algo, expert_dataset, returns)
        write_json(run.ope_metrics, {"dataset": "cartpole-expert", "units": "normalized score", "behaviour": behaviour,
                                     "policy": policy, "estimates": {"fqe": {"value": sum(interval) / 2,
                                                                             "ci_low": interval[0],
                                                                             "ci_high": interval[1]}}})

    summary = report(runs, references, tmp_path / "reports").read_text()

    assert "### `orl select`'s rule, checked against the true scores" in summary
    assert "| fqe+model |" not in summary and "reads of a run by default" not in summary  # FQE alone estimated
    selection = json.loads((tmp_path / "reports" / "selection.json").read_text())["fqe"]
    kept = selection["datasets"]["cartpole-expert"]
    assert kept["kept"] == BEHAVIOUR and kept["best"] == "bc-cartpole-expert" and kept["best_truth"] == 96.0
    assert f"| fqe | cartpole-expert | {BEHAVIOUR} | {kept['kept_truth']:.1f} | bc-cartpole-expert (96.0) |" in summary
    assert "| marwil-cartpole-expert | cartpole-expert | - | 100.8 |" in summary
