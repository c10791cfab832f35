"""Logs in CSV or Parquet, one row per step, with the user's own column names (`imports.NAME.columns`).

Everything is read and checked before anything is written: a bad log names its file, column and row.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from common.envs import env_spaces
from common.errors import UserError, first_line
from dataset_format import Col, column_to_numpy, episode_bounds, flat_dim
from interop.config import ColumnMapping, ImportConfig
from interop.source import Source


def read_log(config: ImportConfig) -> Source:
    mapping = config.columns
    if config.env:
        observation_space, action_space = env_spaces(config.env)
    else:
        observation_space, action_space = config.observation_space.space(), config.action_space.space()
    log = _Log(_files(config), mapping)
    episode = log.column(mapping.episode)
    step = log.number(mapping.step)
    starts, ends = episode_bounds(episode)
    _check_episode_order(log, mapping, episode, step, starts)

    obs = log.vectors(mapping.obs, "obs", flat_dim(observation_space))
    last = np.zeros(len(episode), dtype=bool)
    last[ends - 1] = True
    if mapping.new_obs:
        new_obs = log.vectors(mapping.new_obs, "new_obs", flat_dim(observation_space))
    else:  # the next row's obs within the episode; an episode's last step keeps its own (see ColumnMapping)
        new_obs = np.where(last[:, None], obs, np.roll(obs, -1, axis=0))
    terminated, truncated = _done_flags(log, mapping, last)
    columns = {
        Col.OBS: obs,
        Col.ACTIONS: _actions(log, mapping, action_space),
        Col.REWARDS: log.vectors([mapping.rewards], "rewards", 1)[:, 0],
        Col.NEW_OBS: new_obs,
        Col.TERMINATEDS: terminated,
        Col.TRUNCATEDS: truncated,
    }
    if mapping.action_logp:
        columns[Col.ACTION_LOGP] = log.vectors([mapping.action_logp], "action_logp", 1)[:, 0]

    def episodes():
        for start, end in zip(starts, ends):
            yield {name: values[start:end] for name, values in columns.items()}

    return Source(observation_space, action_space, episodes(), episode_count=len(starts),
                  with_logp=bool(mapping.action_logp), metadata={"columns": _mapping_dict(mapping)},
                  behavior=config.behavior_policy)


def _files(config: ImportConfig) -> list[Path]:
    path = Path(config.source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == f".{config.format}")
        if not files:
            raise UserError(f"{path} holds no *.{config.format} files; point `source` at the log")
        return files
    if not path.is_file():
        raise UserError(f"{path} does not exist; point `source` at the log (a file or a directory of files)")
    return [path]


class _Log:
    """The mapped columns of every file, one after another, and where each row came from."""

    def __init__(self, files: list[Path], mapping: ColumnMapping):
        needed = [mapping.episode, mapping.step, *mapping.obs, *mapping.actions, mapping.rewards, mapping.terminated,
                  mapping.truncated, *mapping.new_obs, mapping.action_logp]
        needed = list(dict.fromkeys(name for name in needed if name))
        tables = [self._read(file, needed) for file in files]
        self.columns = {name: pa.chunked_array([t[name].combine_chunks() for t in tables]) for name in needed}
        self.files = [str(f) for f in files]
        self.file_of_row = np.repeat(np.arange(len(files)), [t.num_rows for t in tables])
        self.first_row = np.r_[0, np.cumsum([t.num_rows for t in tables])[:-1]]

    @staticmethod
    def _read(file: Path, needed: list[str]) -> pa.Table:
        try:
            if file.suffix == ".csv":
                # Every mapped column is read as its own type, except that no text is taken for a timestamp.
                options = pa_csv.ConvertOptions(timestamp_parsers=[])
                table = pa_csv.read_csv(file, convert_options=options)
            else:
                table = pq.read_table(file)
        except (OSError, pa.ArrowException) as err:
            raise UserError(f"{file} is not a readable {file.suffix[1:]} file ({first_line(err)})") from None
        missing = [name for name in needed if name not in table.column_names]
        if missing:
            raise UserError(f"{file}: column '{missing[0]}' named in `columns` is missing; its columns are "
                            f"{', '.join(table.column_names)}")
        return table.select(needed)

    def position(self, row: int) -> tuple[str, int]:
        """(file, row within it, from 0) of a row of the whole log."""
        index = self.file_of_row[row]
        return self.files[index], int(row - self.first_row[index])

    def fail(self, name: str, row: int, problem: str):
        file, file_row = self.position(row)
        raise UserError(f"{file}: column '{name}' at row {file_row} {problem}")

    def present(self, name: str) -> pa.ChunkedArray:
        """The column, once every row has a value."""
        column = self.columns[name]
        if column.null_count:
            self.fail(name, _first_null(column), "is empty; every mapped column needs a value in every row")
        return column

    def column(self, name: str) -> np.ndarray:
        return column_to_numpy(self.present(name))

    def number(self, name: str) -> np.ndarray:
        values = self.column(name)
        if not np.issubdtype(values.dtype, np.number):
            raise UserError(f"{self.files[0]}: column '{name}' holds {self.columns[name].type}, not numbers")
        return values

    def vectors(self, names: list[str], role: str, width: int) -> np.ndarray:
        """The columns side by side as float32 rows of `width` values, each finite."""
        parts = [self._vector(name) for name in names]
        widths = [part.shape[1] for part in parts]
        if sum(widths) != width:
            given = ", ".join(f"'{n}' {w}" for n, w in zip(names, widths))
            raise UserError(f"{self.files[0]}: columns.{role} gives {sum(widths)} values per row ({given}) where the "
                            f"space needs {width}; map the right columns or fix the declared space")
        values = np.hstack(parts)
        for name, part in zip(names, parts):
            bad = ~np.isfinite(part).all(axis=1)
            if bad.any():
                self.fail(name, int(bad.argmax()), "holds NaN or inf")
        return values

    def _vector(self, name: str) -> np.ndarray:
        column = self.present(name)
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) \
                or pa.types.is_fixed_size_list(column.type):
            lengths = column_to_numpy(pc.list_value_length(column))
            if (lengths != lengths[0]).any():
                row = int(np.argmax(lengths != lengths[0]))
                self.fail(name, row, f"holds {lengths[row]} values where the rows before hold {lengths[0]}")
            flat = pc.list_flatten(column)
            return column_to_numpy(flat).astype(np.float32).reshape(len(column), int(lengths[0]))
        values = column_to_numpy(column)
        if not np.issubdtype(values.dtype, np.number) and values.dtype != bool:
            raise UserError(f"{self.files[0]}: column '{name}' holds {column.type}, not numbers")
        return values.astype(np.float32).reshape(-1, 1)


def _first_null(column: pa.ChunkedArray) -> int:
    return int(np.argmax(column_to_numpy(column.is_null())))


def _check_episode_order(log: _Log, mapping: ColumnMapping, episode: np.ndarray, step: np.ndarray,
                         starts: np.ndarray) -> None:
    seen = set()
    for start in starts:
        if episode[start] in seen:
            log.fail(mapping.episode, int(start), f"resumes episode {episode[start]!r} after rows of other episodes "
                     "(interleaved); sort the log by episode, then step")
        seen.add(episode[start])
    continues = np.ones(len(step), dtype=bool)
    continues[starts] = False
    wrong = np.flatnonzero(continues & (step != np.r_[step[0], step[:-1]] + 1))
    if len(wrong):
        row = int(wrong[0])
        log.fail(mapping.step, row, f"is {step[row]} after {step[row - 1]} in episode {episode[row]!r}: steps must "
                 "count up by 1 (rows out of order, or one missing); sort the log by episode, then step")


def _done_flags(log: _Log, mapping: ColumnMapping, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    def flags(name: str) -> np.ndarray:
        if not name:
            return np.zeros(len(last), dtype=bool)
        values = log.vectors([name], name, 1)[:, 0]
        if not np.isin(values, (0.0, 1.0)).all():
            log.fail(name, int(np.argmax(~np.isin(values, (0.0, 1.0)))), "is not true/false (or 1/0)")
        return values.astype(bool)

    terminated, truncated = flags(mapping.terminated), flags(mapping.truncated)
    early = (terminated | truncated) & ~last
    if early.any():
        row = int(early.argmax())
        log.fail(mapping.terminated if terminated[row] else mapping.truncated, row,
                 "ends its episode before the episode's last row; check the episode and step columns")
    if not mapping.truncated:
        truncated = last & ~terminated  # the log stops there
    unended = last & ~(terminated | truncated)
    if unended.any():
        log.fail(mapping.truncated, int(unended.argmax()), "is false on the episode's last row, as is "
                 f"'{mapping.terminated or 'terminated'}'; every episode must end terminated or truncated")
    return terminated, truncated


def _actions(log: _Log, mapping: ColumnMapping, action_space: gym.Space) -> np.ndarray:
    if isinstance(action_space, gym.spaces.Discrete):
        values = log.vectors(mapping.actions, "actions", 1)[:, 0]
        outside = (values != np.round(values)) | (values < 0) | (values >= action_space.n)
        if outside.any():
            log.fail(mapping.actions[0], int(outside.argmax()),
                     f"is {values[outside.argmax()]:g}, not an action of {action_space} (an integer 0 to "
                     f"{action_space.n - 1})")
        return values.astype(np.int64)
    values = log.vectors(mapping.actions, "actions", flat_dim(action_space))
    outside = ((values < action_space.low.ravel()) | (values > action_space.high.ravel())).any(axis=1)
    if outside.any():
        row = int(outside.argmax())
        file, file_row = log.position(row)
        raise UserError(f"{file}: row {file_row}: the action {values[row].tolist()} is outside {action_space}; fix "
                        "the declared bounds or the log")
    return values


def _mapping_dict(mapping: ColumnMapping) -> dict:
    return {key: value for key, value in asdict(mapping).items() if value}
