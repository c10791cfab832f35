"""The files of one training run directory (runs/ALGO-DATASET), named in one place.

`orl train` writes the checkpoint, run.json, train_metrics.json and the learning curve; `orl evaluate` adds
eval.json and the return distribution, `orl ope` ope.json; `orl report` reads them all.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from common.envs import EnvSpec

# The learning curve's column with each algorithm's main loss (algorithms.curve_loss), so one plot spec
# (dvc.yaml's `y: loss`) fits all runs.
CURVE_METRIC = "loss"


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint"

    @property
    def run_info(self) -> Path:
        """run.json: algo, dataset, env id, MLflow run id and registered model."""
        return self.path / "run.json"

    @property
    def train_metrics(self) -> Path:
        return self.path / "train_metrics.json"

    @property
    def learning_curve(self) -> Path:
        return self.path / "learning_curve.csv"

    @property
    def learning_curve_plot(self) -> Path:
        return self.path / "learning_curve.png"

    @property
    def eval_metrics(self) -> Path:
        return self.path / "eval.json"

    @property
    def eval_returns(self) -> Path:
        return self.path / "eval_returns.csv"

    @property
    def eval_returns_plot(self) -> Path:
        return self.path / "eval_returns.png"

    @property
    def ope_metrics(self) -> Path:
        """ope.json: off-policy estimates of the policy (`orl ope`)."""
        return self.path / "ope.json"

    @property
    def resume_dir(self) -> Path:
        """State of an interrupted `orl train`; outside DVC's outs, so re-running the stage finds it."""
        return self.path / ".resume"

    @property
    def resume_checkpoint(self) -> Path:
        return self.resume_dir / "checkpoint"

    @property
    def resume_state(self) -> Path:
        """Inside the checkpoint directory, so one rename replaces both together."""
        return self.resume_checkpoint / "orl_resume.json"

    def info(self) -> dict:
        return json.loads(self.run_info.read_text())

    def env(self) -> EnvSpec | None:
        """The environment of the run's dataset (None: data without a simulator)."""
        info = self.info()
        return EnvSpec.recorded(info["env_id"], info.get("env_spec"))


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_csv(path: Path, rows: list[dict], fieldnames: list[str] | None = None) -> None:
    """Rows under a header of their keys (or `fieldnames`, which an empty table needs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames or list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
