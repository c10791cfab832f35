"""The dataset format: columns, Arrow schema, the card, writing, validation and loading.

This module is the only place that names columns. A dataset is a directory of Parquet files plus
`_card.json` (the leading underscore makes pyarrow, pandas and Ray skip it when reading the directory).
Columns use RLlib's names (`ray.rllib.core.columns.Columns`), so stock RLlib reads a dataset as-is:

    eps_id  int64                          global episode index (also its seed index)
    t       int32                          step within the episode, 0-based
    obs     fixed_size_list<float32>[d]    observation before the step
    actions int64 (Discrete) | fixed_size_list<float32>[k] (Box)
    rewards float32
    new_obs fixed_size_list<float32>[d]    observation after the step
    terminateds, truncateds  bool
    action_logp float32                    log-prob of the action under the behaviour policy, where known
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from collectors.errors import UserError, refuse_to_overwrite

SCHEMA_VERSION = 1
CARD_FILE = "_card.json"
FILE_PREFIX = "episodes"
# Row groups of a fixed row count (about 8 MiB of CartPole rows), not one per collector task: readers get
# groups worth reading, and a file's bytes do not depend on how the work was split.
ROW_GROUP_ROWS = 2**17


class Col:
    """Column names; equal to RLlib's `Columns` constants (a test checks it)."""

    EPS_ID = "eps_id"
    T = "t"
    OBS = "obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    NEW_OBS = "new_obs"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    ACTION_LOGP = "action_logp"


# ---------------------------------------------------------------- spaces


def _encode_bound(values: np.ndarray) -> list:
    # JSON has no infinity; unbounded dimensions are written as the strings "inf"/"-inf".
    return [float(v) if math.isfinite(v) else str(float(v)) for v in np.asarray(values).ravel()]


def space_to_dict(space: gym.Space) -> dict:
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n)}
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _encode_bound(space.low),
            "high": _encode_bound(space.high),
        }
    raise UserError(f"space {space} is not supported: only Box and Discrete spaces are")


def space_from_dict(data: dict) -> gym.Space:
    if data["type"] == "Discrete":
        return gym.spaces.Discrete(data["n"])
    shape = tuple(data["shape"])
    low = np.array([float(v) for v in data["low"]], dtype=data["dtype"]).reshape(shape)
    high = np.array([float(v) for v in data["high"]], dtype=data["dtype"]).reshape(shape)
    return gym.spaces.Box(low, high, shape, dtype=data["dtype"])


def flat_dim(space: gym.spaces.Box) -> int:
    return int(np.prod(space.shape))


def arrow_schema(observation_space: gym.Space, action_space: gym.Space, with_logp: bool) -> pa.Schema:
    """The exact Arrow schema of a dataset with these spaces."""
    obs_type = pa.list_(pa.float32(), flat_dim(observation_space))
    if isinstance(action_space, gym.spaces.Discrete):
        action_type = pa.int64()
    else:
        action_type = pa.list_(pa.float32(), flat_dim(action_space))
    fields = [
        pa.field(Col.EPS_ID, pa.int64(), nullable=False),
        pa.field(Col.T, pa.int32(), nullable=False),
        pa.field(Col.OBS, obs_type, nullable=False),
        pa.field(Col.ACTIONS, action_type, nullable=False),
        pa.field(Col.REWARDS, pa.float32(), nullable=False),
        pa.field(Col.NEW_OBS, obs_type, nullable=False),
        pa.field(Col.TERMINATEDS, pa.bool_(), nullable=False),
        pa.field(Col.TRUNCATEDS, pa.bool_(), nullable=False),
    ]
    if with_logp:
        fields.append(pa.field(Col.ACTION_LOGP, pa.float32(), nullable=False))
    return pa.schema(fields)


def _tensor_column(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    if pa.types.is_fixed_size_list(arrow_type):
        flat = np.ascontiguousarray(values, dtype=np.float32).reshape(len(values), -1)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1])
    return pa.array(values, type=arrow_type)


def transitions_table(columns: dict[str, np.ndarray], schema: pa.Schema) -> pa.Table:
    """Builds one Arrow table from numpy columns (one row per transition), in schema order."""
    return pa.Table.from_arrays(
        [_tensor_column(columns[f.name], f.type) for f in schema], schema=schema
    )


def column_to_numpy(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column as numpy; fixed-size-list columns become 2-D arrays without per-row Python."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_fixed_size_list(column.type):
        return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), column.type.list_size)
    return column.to_numpy(zero_copy_only=False)


# ---------------------------------------------------------------- the card


@dataclass
class DatasetCard:
    """What a dataset is, how it was made, and what it holds; stored as `_card.json`."""

    name: str
    env_id: str
    observation_space: dict
    action_space: dict
    behavior_policy: dict
    seed: int
    episodes: int
    transitions: int
    returns: dict
    episode_length: dict
    columns: list[str]
    files: list[dict]
    code_version: str
    library_versions: dict
    schema_version: int = SCHEMA_VERSION

    @property
    def spaces(self) -> tuple[gym.Space, gym.Space]:
        return space_from_dict(self.observation_space), space_from_dict(self.action_space)

    @property
    def has_action_logp(self) -> bool:
        return Col.ACTION_LOGP in self.columns

    def schema(self) -> pa.Schema:
        return arrow_schema(*self.spaces, with_logp=self.has_action_logp)

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


def read_card(path: str | os.PathLike) -> DatasetCard:
    path = Path(path)
    card_path = path / CARD_FILE
    if not path.is_dir():
        raise UserError(f"dataset directory {path} does not exist: run `orl collect` or `dvc repro` to create it")
    if not card_path.is_file():
        raise UserError(f"{card_path} is missing: {path} is not a dataset made by `orl collect`; re-collect it")
    try:
        data = json.loads(card_path.read_text())
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise UserError(
                f"{card_path}: schema_version {version} is not supported (this code reads {SCHEMA_VERSION}); "
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


def episode_stats(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(undiscounted return, length) of each episode, in eps_id order."""
    eps_id = column_to_numpy(table[Col.EPS_ID])
    rewards = column_to_numpy(table[Col.REWARDS]).astype(np.float64)
    ids, inverse, lengths = np.unique(eps_id, return_inverse=True, return_counts=True)
    return np.bincount(inverse, weights=rewards, minlength=len(ids)), lengths


# ---------------------------------------------------------------- validation


def validate(path: str | os.PathLike, env_spaces: tuple[gym.Space, gym.Space] | None = None) -> DatasetCard:
    """Checks a dataset directory against its card; returns the card or raises UserError naming the problem.

    Checked: the card parses; with `env_spaces`, its spaces equal the environment's; the files are exactly those
    listed; each file reads completely, has exactly the schema the card's spaces imply and the listed row count;
    values are finite and actions inside the action space; episodes are whole, in ascending eps_id order, with
    t counting 0, 1, ..., each ending (and only ending) with terminateds or truncateds, and obs chaining from
    the previous step's new_obs; totals match the card. Files are checked one at a time (bounded memory).
    """
    card, tables = _validated_tables(path, env_spaces)
    for _ in tables:
        pass
    return card


def _validated_tables(path: str | os.PathLike, env_spaces: tuple[gym.Space, gym.Space] | None = None):
    """(card, generator of each file's table once checked); the generator raises at the first problem and
    checks the totals after the last file. Lets loaders read each file once."""
    path = Path(path)
    card = read_card(path)
    if env_spaces is not None:
        for what, ours, env_space in zip(("observation", "action"), card.spaces, env_spaces):
            if space_to_dict(ours) != space_to_dict(env_space):
                raise UserError(
                    f"{path}: the dataset's {what} space {ours} does not match {card.env_id}'s {env_space}; "
                    "use a dataset collected on this environment"
                )
    if card.transitions == 0 or not card.files:
        raise UserError(f"{path} is empty (no transitions); collect it with episodes > 0")
    listed = {f["path"] for f in card.files}
    on_disk = {p.name for p in path.glob("*.parquet")}
    if on_disk != listed:
        extra, missing = sorted(on_disk - listed), sorted(listed - on_disk)
        raise UserError(
            f"{path}: files do not match {CARD_FILE} (missing: {missing}, unexpected: {extra}); re-collect the dataset"
        )

    def tables():
        rows, episodes, chain = 0, 0, _Chain()
        for entry in card.files:
            file = path / entry["path"]
            file_rows = 0
            for table in _row_groups_checked(file, card.schema(), entry["rows"]):
                group_episodes, chain = _check_values(file, table, card.spaces, chain, file_rows)
                file_rows, episodes = file_rows + table.num_rows, episodes + group_episodes
                yield table
            if not chain.ended:
                raise UserError(f"{file}: column '{Col.TERMINATEDS}' at row {file_rows - 1} ends its episode "
                                "without terminateds or truncateds; re-collect the dataset")
            rows += file_rows
        if (rows, episodes) != (card.transitions, card.episodes):
            raise UserError(f"{path} holds {rows} transitions in {episodes} episodes but {CARD_FILE} says "
                            f"{card.transitions} in {card.episodes}; re-collect the dataset")

    return card, tables()


def _row_groups_checked(file: Path, expected: pa.Schema, rows: int):
    """The file's row groups as tables, once its schema and row count are checked: memory holds one group
    (131,072 rows as collected), not the file."""
    try:
        _check_schema(file, pq.read_schema(file), expected)
        parquet = pq.ParquetFile(file)
        if parquet.metadata.num_rows != rows:
            raise UserError(f"{file} has {parquet.metadata.num_rows} rows but {CARD_FILE} says {rows}; "
                            "re-collect the dataset")
        for group in range(parquet.num_row_groups):
            yield parquet.read_row_group(group)
    except (OSError, pa.ArrowException) as err:
        reason = str(err).splitlines()[0]
        raise UserError(f"{file} is not a readable Parquet file ({reason}); re-collect the dataset") from None


@dataclass
class _Chain:
    """The last row checked, which the next row continues unless it ended its episode."""

    eps_id: int = -1
    t: int = -1
    ended: bool = True
    new_obs: np.ndarray | None = None


def _check_values(file: Path, table: pa.Table, spaces: tuple[gym.Space, gym.Space], chain: _Chain,
                  first_row: int) -> tuple[int, _Chain]:
    """Value and episode-structure checks of consecutive rows of a file (a row group) that follow `chain`;
    `first_row` is the first one's row in the file. Returns (episodes started in them, their last row)."""
    def fail(column: str, row: int, problem: str):
        raise UserError(f"{file}: column '{column}' at row {first_row + row} {problem}; re-collect the dataset")

    if table.num_rows == 0:
        return 0, chain
    arrays = {name: column_to_numpy(table[name]) for name in table.column_names}
    for name in (Col.OBS, Col.NEW_OBS, Col.REWARDS, Col.ACTION_LOGP):
        if name in arrays:
            bad = ~np.isfinite(arrays[name])
            bad = bad.reshape(len(bad), -1).any(axis=1)
            if bad.any():
                fail(name, int(bad.argmax()), "holds NaN or inf")
    _, action_space = spaces
    actions = arrays[Col.ACTIONS]
    if isinstance(action_space, gym.spaces.Discrete):
        outside = (actions < 0) | (actions >= action_space.n)
    else:
        outside = ((actions < action_space.low.ravel()) | (actions > action_space.high.ravel())).any(axis=1)
    if outside.any():
        fail(Col.ACTIONS, int(outside.argmax()), f"is outside the action space {action_space}")

    # Each row against the row before it (the chain's, for the first): a row starts an episode exactly when
    # the row before ended one.
    eps_id, t, obs, new_obs = arrays[Col.EPS_ID], arrays[Col.T], arrays[Col.OBS], arrays[Col.NEW_OBS]
    done = arrays[Col.TERMINATEDS] | arrays[Col.TRUNCATEDS]
    starts = np.r_[chain.ended, done[:-1]]
    previous_eps_id = np.r_[chain.eps_id, eps_id[:-1]]
    early = starts & (eps_id == previous_eps_id)
    early[0] &= first_row > 0  # at a file's first row the chain is the previous file's: an order problem
    if early.any():
        fail(Col.TERMINATEDS, int(early.argmax()) - 1, "ends its episode early")
    unended = np.flatnonzero(~starts & (eps_id != previous_eps_id))
    if len(unended):
        fail(Col.TERMINATEDS, int(unended[0]) - 1, "ends its episode without terminateds or truncateds")
    out_of_order = np.flatnonzero(starts & (eps_id <= previous_eps_id))
    if len(out_of_order):
        fail(Col.EPS_ID, int(out_of_order[0]), "breaks the order: episodes must be whole and in ascending eps_id order")
    expected_t = np.where(starts, 0, np.r_[chain.t, t[:-1]] + 1)
    if np.any(t != expected_t):
        row = int(np.argmax(t != expected_t))
        fail(Col.T, row, f"is {t[row]} where episode {eps_id[row]} is at step {expected_t[row]}")
    previous_new_obs = np.concatenate([new_obs[:1] if chain.new_obs is None else chain.new_obs[None], new_obs[:-1]])
    mismatch = np.flatnonzero(~starts & np.any(obs != previous_new_obs, axis=1))
    if len(mismatch):
        fail(Col.OBS, int(mismatch[0]), "is not the previous step's new_obs")
    return int(starts.sum()), _Chain(int(eps_id[-1]), int(t[-1]), bool(done[-1]), new_obs[-1].copy())


def _check_schema(file: Path, actual: pa.Schema, expected: pa.Schema) -> None:
    for expected_field in expected:
        if expected_field.name not in actual.names:
            raise UserError(f"{file}: column '{expected_field.name}' is missing; re-collect the dataset")
        actual_type = actual.field(expected_field.name).type
        if actual_type != expected_field.type:
            raise UserError(
                f"{file}: column '{expected_field.name}' has type {actual_type}, expected {expected_field.type}; "
                "re-collect the dataset"
            )
    unexpected = [name for name in actual.names if name not in expected.names]
    if unexpected:
        raise UserError(f"{file}: unexpected columns {unexpected}; re-collect the dataset")


# ---------------------------------------------------------------- writing


def _ordered_parquet_sink(path: Path, file_bytes: int):
    """A Ray Data sink that writes each bundle of about `file_bytes` of rows to one Parquet file, in the order
    the rows come. Ray's `write_parquet` goes through pyarrow's threaded dataset writer, which may reorder
    batches of rows (apache/arrow#26818): blocks of over 2**18 rows (tasks of 1,000 CartPole expert episodes)
    came out interleaved in 131,072-row pieces."""
    from ray.data.datasource import BlockBasedFileDatasink, FilenameProvider  # Ray is needed only to write

    class FileNames(FilenameProvider):
        # Ray's default names embed a random UUID, which would change the DVC hash of identical data.
        def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
            return f"{FILE_PREFIX}-{task_index:05d}.parquet"

    class OrderedParquetSink(BlockBasedFileDatasink):
        @property
        def min_bytes_per_write(self) -> int:
            return file_bytes

        def write_block_to_file(self, block, file) -> None:
            pq.write_table(block.to_arrow(), file, row_group_size=ROW_GROUP_ROWS, compression="zstd")

    return OrderedParquetSink(str(path), filename_provider=FileNames())


def write(transitions, path: str | os.PathLike, card: DatasetCard, file_bytes: int) -> DatasetCard:
    """Writes a Ray Dataset of transitions, in order, to Parquet files of about `file_bytes` of rows in memory
    each; then the card, completed with what the files hold (files, transitions, returns, episode lengths).

    The files go to a hidden staging directory beside `path`, are validated, and the directory is renamed
    into place, so `path` only ever holds a complete dataset. `path` must not exist.
    """
    path = Path(path)
    refuse_to_overwrite(path)
    staging = path.parent / f".{path.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    # The write tasks take no CPU: the collector actors hold the CPUs while files are written.
    transitions.write_datasink(_ordered_parquet_sink(staging, file_bytes), ray_remote_args={"num_cpus": 0})
    files = sorted(staging.glob("*.parquet"))
    # Per file, then joined: files are cut between episodes, and only per-episode numbers are kept.
    returns, lengths = map(np.concatenate, zip(*(episode_stats(pq.read_table(f, columns=[Col.EPS_ID, Col.REWARDS]))
                                                 for f in files)))
    card = dataclasses.replace(card, files=[{"path": f.name, "rows": pq.read_metadata(f).num_rows} for f in files],
                               transitions=int(lengths.sum()), returns=summarize(returns),
                               episode_length=summarize(lengths))
    (staging / CARD_FILE).write_text(card.to_json())
    validate(staging)
    os.rename(staging, path)
    return card


# ---------------------------------------------------------------- loading, for training and for users


def size_on_disk(path: str | os.PathLike) -> int:
    """Bytes of the dataset's Parquet files."""
    return sum((Path(path) / f["path"]).stat().st_size for f in read_card(path).files)


def load_table(path: str | os.PathLike) -> pa.Table:
    """The whole dataset as one Arrow table, each file read once and validated on the way."""
    return _one_table(*_validated_tables(path))


def read_table(path: str | os.PathLike) -> pa.Table:
    """The whole dataset as one Arrow table, read without checks: for callers that validated it already
    (`orl train` does before training; checking 1M transitions again took 0.7 s of its start-up)."""
    card = read_card(path)
    return _one_table(card, (pq.read_table(Path(path) / entry["path"]) for entry in card.files))


def _one_table(card: DatasetCard, tables) -> pa.Table:
    names = card.schema().names  # files may order their columns differently
    return pa.concat_tables([table.select(names) for table in tables])


def load_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The whole validated dataset in memory as numpy arrays: obs is (N, d), actions (N,) or (N, k)."""
    table = load_table(path)
    return {name: column_to_numpy(table[name]) for name in table.column_names}


def load_pandas(path: str | os.PathLike):
    """A pandas DataFrame, one row per transition (obs cells are numpy arrays); the same as
    `pd.read_parquet(path)`, validated."""
    return load_table(path).to_pandas()


def load_ray(path: str | os.PathLike):
    """A streaming Ray Dataset over the files (Ray must be initialized or it starts a local one)."""
    import ray

    card = validate(path)
    return ray.data.read_parquet([str(Path(path) / f["path"]) for f in card.files])


def torch_dataloader(path: str | os.PathLike, batch_size: int = 256, shuffle: bool = True, seed: int = 0):
    """A torch DataLoader of (obs, actions) float32/int64 tensors for behaviour cloning."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    arrays = load_arrays(path)  # may be read-only views of Arrow memory, so torch gets copies
    dataset = TensorDataset(torch.tensor(arrays[Col.OBS]), torch.tensor(arrays[Col.ACTIONS]))
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator)

