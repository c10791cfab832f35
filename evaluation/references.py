"""An environment's references (references/ENV.json, written by `orl reference`) and the normalized score.

The normalized score is D4RL's: 100 * (R - floor) / (ceiling - floor), where the floor and the ceiling are the
mean returns of params.yaml's `references:` policies (random and none unless given) on the same evaluation seeds
as the policy, or fixed returns. The file keeps D4RL's names for them: `random` (the floor) and `expert` (the
ceiling); an env without a ceiling has no `expert`, and its scores are raw returns.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.errors import UserError
from evaluation.config import EvaluateConfig

FLOOR, CEILING = "random", "expert"


def reference_path(references_dir: Path, env_name: str) -> Path:
    return Path(references_dir) / f"{env_name}.json"


def read_reference(references_dir: str | Path, env_name: str, config: EvaluateConfig) -> dict:
    path = reference_path(Path(references_dir), env_name)
    if not path.is_file():
        raise UserError(f"{path} is missing; run `orl reference` (or dvc repro) first")
    reference = json.loads(path.read_text())
    if (reference["seed"], reference["episodes"]) != (config.seed, config.episodes):
        raise UserError(f"{path} was measured on other evaluation seeds than evaluate.seed/episodes; "
                        "re-run `orl reference`")
    return reference


def normalized_score(mean_return: float, reference: dict) -> float | None:
    """None where the env has no ceiling."""
    if CEILING not in reference:
        return None
    floor, ceiling = reference[FLOOR]["mean"], reference[CEILING]["mean"]
    return 100.0 * (mean_return - floor) / (ceiling - floor)


def no_score_reason(env_name: str) -> str:
    return (f"no normalized score: {env_name} has no ceiling reference (give references.{env_name}.ceiling or "
            "ref_max in params.yaml); returns are raw")


def reference_returns(reference: dict) -> dict[str, float]:
    """The references' mean returns by name, for plots."""
    return {name: reference[name]["mean"] for name in (FLOOR, CEILING) if name in reference}
