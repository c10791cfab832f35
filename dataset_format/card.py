"""The dataset card, `_card.json`: what a dataset is, how it was made and what it holds.

A dataset is a directory of Parquet files plus its card (the leading underscore makes pyarrow, pandas and Ray
skip it when reading the directory).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pyarrow as pa

from common.code_version import code_version, library_versions
from common.envs import EnvSpec
from common.errors import UserError
from dataset_format.location import Location, locate
from dataset_format.schema import (
    SCHEMA_VERSION,
    Col,
    arrow_schema,
    column_to_numpy,
    space_from_dict,
    space_to_dict,
)

CARD_FILE = "_card.json"


@dataclass
class DatasetCard:
    """What a dataset is, how it was made, and what it holds; stored as `_card.json`."""

    name: str
    env_id: str | None
    """The name of the environment that evaluates policies trained on it (its spec's `label`); None for data
    without a simulator (imported with declared spaces): such a dataset trains, and the stages that run the
    environment skip it."""
    observation_space: dict
    action_space: dict
    behavior_policy: dict
    seed: int | None
    """The collection seed; None for imported data."""
    episodes: int
    transitions: int
    returns: dict
    episode_length: dict
    columns: list[str]
    files: list[dict]
    code_version: str
    library_versions: dict
    env_spec: dict | None = None
    """How to make that environment (common/envs.py's `EnvSpec`, as params.yaml gave it); cards written before
    specs existed name a registered id in `env_id` alone. `library_versions` has the versions of the packages
    that provide it."""
    source: dict | None = None
    """Where imported data came from (`orl datasets import`): its format, path or Minari id, column mapping and
    the source's own metadata. None for data collected here."""
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def new(cls, name: str, env: EnvSpec | None, spaces: tuple[gym.Space, gym.Space], behavior_policy: dict,
            seed: int | None, episodes: int, with_logp: bool, code: tuple[str, ...], providers: dict[str, str],
            source: dict | None = None) -> DatasetCard:
        """The card of a dataset about to be written: what its files hold (transitions, returns, episode lengths,
        the files) is filled in as they are written (`write`, `write_tables`). `code` names the folders its bytes
        depend on (see `code_version`), `providers` the versions of the packages that provide its env
        (common.envs.provider_versions)."""
        observation_space, action_space = spaces
        return cls(
            name=name,
            env_id=env.label if env else None,
            env_spec=env.to_dict() if env else None,
            observation_space=space_to_dict(observation_space),
            action_space=space_to_dict(action_space),
            behavior_policy=behavior_policy,
            seed=seed,
            episodes=episodes,
            transitions=0,
            returns={},
            episode_length={},
            files=[],
            columns=list(arrow_schema(observation_space, action_space, with_logp).names),
            code_version=code_version(code),
            library_versions={**library_versions(), **providers},
            source=source,
        )

    @property
    def spaces(self) -> tuple[gym.Space, gym.Space]:
        return space_from_dict(self.observation_space), space_from_dict(self.action_space)

    @property
    def env(self) -> EnvSpec | None:
        """The environment the data comes from, made with `common.envs.make_env`; None without a simulator."""
        return EnvSpec.recorded(self.env_id, self.env_spec)

    @property
    def task(self) -> str:
        """What MLflow experiments and registered models are named after: the environment, or the dataset itself
        when it has none."""
        return self.env_id or self.name

    @property
    def has_action_logp(self) -> bool:
        return Col.ACTION_LOGP in self.columns

    def schema(self) -> pa.Schema:
        return arrow_schema(*self.spaces, with_logp=self.has_action_logp, schema_version=self.schema_version)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    def summary(self) -> dict:
        """The fields worth showing a person or logging as run params."""
        return {
            "name": self.name,
            "env_id": self.env_id,
            "behavior_policy": self.behavior_policy,
            "seed": self.seed,
            "episodes": self.episodes,
            "transitions": self.transitions,
            "return_mean": self.returns["mean"],
            "return_std": self.returns["std"],
            "schema_version": self.schema_version,
            "code_version": self.code_version,
        }


def read_card(path: str | os.PathLike | Location) -> DatasetCard:
    """The card of the dataset at a local path or s3:// URI. The card is written last, so a directory or prefix
    without one (an interrupted write, or no dataset) is refused."""
    location = locate(path)
    card_path = location.uri_of(CARD_FILE)
    if not location.exists():
        raise UserError(f"dataset {location} does not exist: run `orl collect` or `dvc repro` to create it")
    if not location.is_file(CARD_FILE):
        raise UserError(f"{card_path} is missing: {location} is not a whole dataset made by `orl collect` (or its "
                        "writing was interrupted); re-collect it")
    try:
        data = json.loads(location.read_text(CARD_FILE))
        version = data.get("schema_version")
        if version not in range(1, SCHEMA_VERSION + 1):
            raise UserError(
                f"{card_path}: schema_version {version} is not supported (this code reads 1 to {SCHEMA_VERSION}); "
                "re-collect the dataset with this version"
            )
        names = {f.name for f in dataclasses.fields(DatasetCard)}
        card = DatasetCard(**{k: v for k, v in data.items() if k in names})
        card.spaces  # parses both spaces, so a broken space fails here
        return card
    except UserError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise UserError(f"{card_path} is corrupt ({err}); re-collect the dataset") from None


def summarize(values: np.ndarray) -> dict:
    values = np.asarray(values, dtype=np.float64)
    return {"mean": float(values.mean()), "std": float(values.std()),
            "min": float(values.min()), "max": float(values.max())}


def episode_bounds(eps_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row, row after the last) of each episode: a dataset's rows are
    episode after episode (a run of equal ids), each in step order."""
    starts = np.flatnonzero(np.r_[True, eps_id[1:] != eps_id[:-1]])
    return starts, np.r_[starts[1:], len(eps_id)]


def episode_stats(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(undiscounted return, length) of each episode, in eps_id order."""
    eps_id = column_to_numpy(table[Col.EPS_ID])
    rewards = column_to_numpy(table[Col.REWARDS]).astype(np.float64)
    ids, inverse, lengths = np.unique(eps_id, return_inverse=True, return_counts=True)
    return np.bincount(inverse, weights=rewards, minlength=len(ids)), lengths
