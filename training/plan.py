"""What `orl train` checks before Ray, RLlib and torch start (seconds to load): a bad input fails at once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import dataset_format as dataset
from common.envs import env_spaces
from common.errors import refuse_to_overwrite
from common.run_dir import RunDir
from training.config import LearnerParams


@dataclass(frozen=True)
class TrainingPlan:
    """One algorithm on one dataset, its input checked; `training.train.train` runs it."""

    algo: str
    """The algorithm's name in params.yaml's `algos` (and in training.algorithms.registry)."""
    params: LearnerParams
    """The learner's settings, `per_dataset` values already applied (LearnerParams.for_dataset)."""
    dataset: dataset.Location
    """Where the dataset is: a directory or an s3:// prefix."""
    card: dataset.DatasetCard
    """The dataset's card, read once here and handed down."""
    run: RunDir
    """The run directory the training writes."""
    seed: int
    """Seeds the network's initialisation and the order batches are drawn in (params.yaml's `train.seed`, or
    `orl train --seed`)."""

    @property
    def label(self) -> str:
        """The prefix of the run's progress lines."""
        return f"train {self.algo} {self.card.name}"


def plan_training(algo: str, params: LearnerParams, dataset_path: str | Path | dataset.Location,
                  out_dir: str | Path, seed: int) -> TrainingPlan:
    """The plan, once the dataset passed every check (against its env's spaces where it names one) and no earlier
    run's outputs are in the way; otherwise a UserError naming the problem."""
    location = dataset.locate(dataset_path)
    card = dataset.read_card(location)
    dataset.validate(location, env_spaces(card.env) if card.env else None, card)
    run = RunDir(Path(out_dir))
    for output in (run.checkpoint, run.run_info):
        refuse_to_overwrite(output)
    return TrainingPlan(algo, params, location, card, run, seed)
