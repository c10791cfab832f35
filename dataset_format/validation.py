"""Every check a dataset passes before anything reads it for training (and `orl datasets validate` runs)."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NoReturn

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.errors import UserError, first_line
from dataset_format.card import CARD_FILE, DatasetCard, read_card
from dataset_format.location import Location, locate, storage_error
from dataset_format.schema import Col, FrameColumn, FrameNumbering, column_to_numpy, flat_dim, is_frames_type, \
    space_to_dict


def validate(path: str | os.PathLike | Location, env_spaces: tuple[gym.Space, gym.Space] | None = None,
             card: DatasetCard | None = None) -> DatasetCard:
    """Checks a dataset (a directory or s3:// prefix) against its card; returns the card or raises UserError naming
    the problem.

    Checked: the card parses; with `env_spaces`, its spaces equal the environment's; the files are exactly those
    listed; each file reads completely, has exactly the schema the card's spaces imply and the listed row count;
    values are finite and actions inside the action space; episodes are whole, in ascending eps_id order, with
    t counting 0, 1, ..., each ending (and only ending) with terminateds or truncateds, and obs chaining from
    the previous step's new_obs; totals match the card. Files are checked one at a time (bounded memory).
    `card`, when the caller has read it already, is not read again.
    """
    location = locate(path)
    card, tables = files_checked_against(location, card or read_card(location), env_spaces)
    for _ in tables:
        pass
    return card


def validated_tables(path: str | os.PathLike | Location, env_spaces: tuple[gym.Space, gym.Space] | None = None):
    """(card, generator of each file's table once checked); the generator raises at the first problem and
    checks the totals after the last file. Lets loaders read each file once."""
    location = locate(path)
    return files_checked_against(location, read_card(location), env_spaces)


def files_checked_against(location: Location, card: DatasetCard,
                          env_spaces: tuple[gym.Space, gym.Space] | None = None):
    """`validated_tables` for a card in hand: the writer checks the files before it writes their card."""
    if env_spaces is not None:
        for what, ours, env_space in zip(("observation", "action"), card.spaces, env_spaces):
            if space_to_dict(ours) != space_to_dict(env_space):
                raise UserError(
                    f"{location}: the dataset's {what} space {ours} does not match {card.env_id}'s {env_space}; "
                    "use a dataset collected on this environment"
                )
    if card.transitions == 0 or not card.files:
        raise UserError(f"{location} is empty (no transitions); collect it with episodes > 0")
    listed = {f["path"] for f in card.files}
    on_disk = {name for name in location.files() if name.endswith(".parquet")}
    if on_disk != listed:
        extra, missing = sorted(on_disk - listed), sorted(listed - on_disk)
        raise UserError(
            f"{location}: files do not match {CARD_FILE} (missing: {missing}, unexpected: {extra}); "
            "re-collect the dataset"
        )

    def tables():
        rows, episodes, chain = 0, 0, _Chain()
        for entry in card.files:
            file = location.uri_of(entry["path"])
            file_rows = 0
            for table in _row_groups_checked(location, entry["path"], card.schema(), entry["rows"]):
                group_episodes, chain = _check_values(file, table, card.spaces, chain, file_rows)
                file_rows, episodes = file_rows + table.num_rows, episodes + group_episodes
                yield table
            if not chain.ended:
                raise UserError(f"{file}: column '{Col.TERMINATEDS}' at row {file_rows - 1} ends its episode "
                                "without terminateds or truncateds; re-collect the dataset")
            rows += file_rows
        if (rows, episodes) != (card.transitions, card.episodes):
            raise UserError(f"{location} holds {rows} transitions in {episodes} episodes but {CARD_FILE} says "
                            f"{card.transitions} in {card.episodes}; re-collect the dataset")

    return card, tables()


def _row_groups_checked(location: Location, name: str, expected: pa.Schema, rows: int):
    """The file's row groups as tables, once its schema and row count are checked: memory holds one group
    (`writer.row_group_rows` as collected), not the file."""
    file = location.uri_of(name)
    with open_parquet(location, name) as parquet:
        _check_schema(file, parquet.schema_arrow, expected)
        if parquet.metadata.num_rows != rows:
            raise UserError(f"{file} has {parquet.metadata.num_rows} rows but {CARD_FILE} says {rows}; "
                            "re-collect the dataset")
        for group in range(parquet.num_row_groups):
            yield parquet.read_row_group(group)


@contextmanager
def open_parquet(location: Location, name: str):
    """The dataset's file `name` opened for Parquet reads; a file that cannot be read, there or in the reads inside
    the block, ends in one line naming it."""
    try:
        with location.fs.open_input_file(location.path(name)) as handle:
            yield pq.ParquetFile(handle)
    except (OSError, pa.ArrowException) as err:
        if isinstance(err, OSError) and not location.is_local:  # the store failed, not the file
            raise storage_error(location, err) from None
        raise UserError(f"{location.uri_of(name)} is not a readable Parquet file ({first_line(err)}); "
                        "re-collect the dataset") from None


@dataclass
class _Chain:
    """The last row checked, which the next row continues unless it ended its episode."""

    eps_id: int = -1
    t: int = -1
    ended: bool = True
    new_obs: np.ndarray | None = None


def _check_values(file: str, table: pa.Table, spaces: tuple[gym.Space, gym.Space], chain: _Chain,
                  first_row: int) -> tuple[int, _Chain]:
    """Value and episode-structure checks of consecutive rows of a file (a row group) that follow `chain`;
    `first_row` is the first one's row in the file. Returns (episodes started in them, their last row)."""
    def fail(column: str, row: int, problem: str):
        raise UserError(f"{file}: column '{column}' at row {first_row + row} {problem}; re-collect the dataset")

    if table.num_rows == 0:
        return 0, chain
    observation_space, action_space = spaces
    arrays = {name: column_to_numpy(table[name]) for name in table.column_names if name not in (Col.OBS, Col.NEW_OBS)}
    chain_new_obs, arrays[Col.OBS], arrays[Col.NEW_OBS], last_new_obs = _observations(
        table, observation_space, chain.new_obs, fail)
    for name in (Col.OBS, Col.NEW_OBS, Col.REWARDS, Col.ACTION_LOGP):
        if name in arrays and arrays[name].dtype.kind == "f":  # integers (pixels, frame ids) are finite
            bad = ~np.isfinite(arrays[name])
            bad = bad.reshape(len(bad), -1).any(axis=1)
            if bad.any():
                fail(name, int(bad.argmax()), "holds NaN or inf")
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
    previous_new_obs = np.concatenate([new_obs[:1] if chain_new_obs is None else chain_new_obs[None], new_obs[:-1]])
    mismatch = np.flatnonzero(~starts & (obs != previous_new_obs).reshape(len(obs), -1).any(axis=1))
    if len(mismatch):
        fail(Col.OBS, int(mismatch[0]), "is not the previous step's new_obs")
    return int(starts.sum()), _Chain(int(eps_id[-1]), int(t[-1]), bool(done[-1]), last_new_obs)


def _observations(table: pa.Table, observation_space: gym.Space, chain_new_obs: np.ndarray | None,
                  fail: Callable[[str, int, str], NoReturn]):
    """(the chain's new_obs, the rows' obs and new_obs, the last new_obs as the next group's chain) as arrays whose
    rows are equal exactly when the observations are. Frames are compared by their ids in one numbering of the
    group's frames (and the chain's), shared by both columns, not by images rebuilt from them: a group holds each
    frame once, and every image up to 8 times."""
    if not is_frames_type(table.schema.field(Col.OBS).type):
        obs, new_obs = column_to_numpy(table[Col.OBS]), column_to_numpy(table[Col.NEW_OBS])
        return chain_new_obs, obs, new_obs, new_obs[-1].copy()
    numbering, ids = FrameNumbering(), {}
    chain_ids = None if chain_new_obs is None else numbering.ids(chain_new_obs[None])[0]
    for name in (Col.OBS, Col.NEW_OBS):
        try:
            columns = [FrameColumn.of_arrow(chunk) for chunk in table[name].chunks]
        except ValueError as err:  # frames of unequal sizes
            fail(name, 0, f"cannot be read in its group of rows ({err})")
        for width in {column.ids.shape[1] * column.frames.shape[1] for column in columns}:
            if width != flat_dim(observation_space):
                fail(name, 0, f"holds images of {width} bytes where the card's {observation_space.shape} take "
                              f"{flat_dim(observation_space)}")
        ids[name] = np.concatenate([column.numbered(numbering) for column in columns])
    last = columns[-1]  # new_obs'
    return chain_ids, ids[Col.OBS], ids[Col.NEW_OBS], last.frames[last.ids[-1]].copy()


def _check_schema(file: str, actual: pa.Schema, expected: pa.Schema) -> None:
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
