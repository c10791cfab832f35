"""The random and expert references (references/ENV.json, written by `orl reference`) and the normalized score.

The normalized score is D4RL's: 100 * (R - R_random) / (R_expert - R_random), where both references are
measured on the same evaluation seeds as the policy.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.errors import UserError
from evaluation.config import EvaluateConfig

REFERENCE_POLICIES = ("random", "expert")


def reference_path(references_dir: Path, env_id: str) -> Path:
    return Path(references_dir) / f"{env_id}.json"


def read_reference(references_dir: str | Path, env_id: str, config: EvaluateConfig) -> dict:
    path = reference_path(Path(references_dir), env_id)
    if not path.is_file():
        raise UserError(f"{path} is missing; run `orl reference` (or dvc repro) first")
    reference = json.loads(path.read_text())
    if (reference["seed"], reference["episodes"]) != (config.seed, config.episodes):
        raise UserError(f"{path} was measured on other evaluation seeds than evaluate.seed/episodes; "
                        "re-run `orl reference`")
    return reference


def normalized_score(mean_return: float, reference: dict) -> float:
    random, expert = reference["random"]["mean"], reference["expert"]["mean"]
    return 100.0 * (mean_return - random) / (expert - random)
