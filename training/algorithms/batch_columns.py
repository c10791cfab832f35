"""Train batch columns computed from the dataset's rows with numpy: the stateless functions Ray Data tasks map.

This module imports neither torch nor RLlib, so the Ray Data workers that run these functions start quickly
and stay small (each would otherwise import and hold both). RLlib's batch column names are written out here;
tests/training/algorithms/test_train_batches.py checks them against RLlib's `Columns`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from common.observations import ModelInput
from dataset_format import Col, column_to_numpy

# RLlib's names: the module id of a single-agent batch, and its `Columns`.
DEFAULT_MODULE_ID = "default_policy"
OBS, NEXT_OBS, ACTIONS, REWARDS = "obs", "new_obs", "actions", "rewards"
TERMINATEDS, TRUNCATEDS, ACTION_LOGP = "terminateds", "truncateds", "action_logp"
VALUE_TARGETS = "value_targets"
# Ours: MARWIL's value target adds BOOTSTRAP_DISCOUNT * V(BOOTSTRAP_OBS), computed by the learner.
BOOTSTRAP_OBS, BOOTSTRAP_DISCOUNT = "bootstrap_obs", "bootstrap_discount"

# Dataset column -> train batch column, for the columns RLlib's learners read (each reads some of them).
TRAIN_COLUMNS = {
    Col.OBS: OBS,
    Col.ACTIONS: ACTIONS,
    Col.REWARDS: REWARDS,
    Col.NEW_OBS: NEXT_OBS,
    Col.TERMINATEDS: TERMINATEDS,
    Col.TRUNCATEDS: TRUNCATEDS,
    Col.ACTION_LOGP: ACTION_LOGP,
}
FLOAT_COLUMNS = (REWARDS, ACTION_LOGP)  # observations stay as stored until `network_observations`
# The batch columns that hold observations.
OBSERVATION_COLUMNS = frozenset(f"{DEFAULT_MODULE_ID}/{name}" for name in (OBS, NEXT_OBS, BOOTSTRAP_OBS))
# Steps in each row's TD target; RLlib's DQN learner discounts the bootstrap by gamma ** batch["n_step"].
N_STEP = "n_step"


def transitions(rows: pa.Table, names: tuple[str, ...] = tuple(TRAIN_COLUMNS.values())) -> dict[str, np.ndarray]:
    """The learner's columns of a batch of dataset rows (those of `names` the rows have), by their RLlib names
    (observations as 2-D arrays, converted by Arrow, not row by row, in their stored dtype). The batch functions
    below only select and reorder observations, so they work as well on the ids of `dataset_format.read_frames`."""
    columns = {out: column_to_numpy(rows[col]) for col, out in TRAIN_COLUMNS.items()
               if out in names and col in rows.column_names}
    for name in FLOAT_COLUMNS:
        if name in columns:
            columns[name] = columns[name].astype(np.float32, copy=False)
    return columns


def network_observations(batch: dict[str, np.ndarray], model_input: ModelInput | None) -> dict[str, np.ndarray]:
    """The batch with its observation columns as the network takes them: vectors as float32, and with a
    `model_input`, images channels-last in [0, 1], Discrete observations one-hot."""
    return {name: values if name not in OBSERVATION_COLUMNS else
            model_input(values) if model_input else values.astype(np.float32, copy=False)
            for name, values in batch.items()}


def flat(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Keyed by module, flattened, as RLlib's learners take offline batches."""
    return {f"{DEFAULT_MODULE_ID}/{name}": values for name, values in columns.items()}


def reads(*columns: str):
    """Declares the dataset columns a batch function reads (`function.columns`): readers read only those."""
    def declare(function):
        function.columns = columns
        return function

    return declare


@reads(Col.OBS, Col.ACTIONS)
def cloning_batch(rows: pa.Table) -> dict[str, np.ndarray]:
    """BC's batch: observations and the actions taken.

    Each batch function returns only the columns its learner reads: the learner's batches are indexed column
    by column at every update, and BC's held columns it never reads.
    """
    return flat(transitions(rows, (OBS, ACTIONS)))


@reads(Col.OBS, Col.ACTIONS)
def cloning_batch_in_unit_actions(rows: pa.Table, low: np.ndarray, high: np.ndarray,
                                  margin: float) -> dict[str, np.ndarray]:
    """BC's batch for a tanh-squashed policy: Box actions rescaled to [-1, 1] (`unit_actions`)."""
    columns = transitions(rows, (OBS, ACTIONS))
    columns[ACTIONS] = unit_actions(columns[ACTIONS], low, high, margin)
    return flat(columns)


def episode_run_ends(eps_id: np.ndarray, t: np.ndarray) -> np.ndarray:
    """True at each row that is the last of its run of consecutive steps of one episode in this batch."""
    run_ends = np.ones(len(eps_id), dtype=bool)
    run_ends[:-1] = (eps_id[1:] != eps_id[:-1]) | (t[1:] != t[:-1] + 1)
    return run_ends


def returns_to_go(rewards: np.ndarray, run_ends: np.ndarray, gamma: float) -> np.ndarray:
    """sum_k gamma^k r_{t+k} over the rest of each row's run."""
    out = np.empty(len(rewards), dtype=np.float32)
    running, last = 0.0, len(rewards) - 1
    # A loop over Python floats: far ahead of any learner, and exact (a vectorised gamma^-t rescaling
    # overflows or loses precision on long episodes).
    for i, (reward, end) in enumerate(zip(reversed(rewards.tolist()), reversed(run_ends.tolist()))):
        running = reward + gamma * (0.0 if end else running)
        out[last - i] = running
    return out


@reads(Col.OBS, Col.ACTIONS, Col.REWARDS, Col.NEW_OBS, Col.TERMINATEDS, Col.EPS_ID, Col.T)
def with_returns(rows: pa.Table, gamma: float) -> dict[str, np.ndarray]:
    """Transitions plus MARWIL's value targets: the behaviour policy's discounted returns-to-go.

    A run of an episode's steps that does not end it (the env's time limit cut it, or this batch of rows does) goes on
    past its last row: each of its rows carries that row's new_obs and gamma^(steps to it), and the learner adds that
    discount times the value there. Stopped at the limit instead, the returns of a random episode's last steps would
    be those of a goal's approach (Acrobot's -1 per step), and MARWIL would copy the random actions there.
    """
    columns = transitions(rows, (OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS))
    run_ends = episode_run_ends(column_to_numpy(rows[Col.EPS_ID]), column_to_numpy(rows[Col.T]))
    run_of_row = np.concatenate([[0], np.cumsum(run_ends[:-1])])
    last_of_row = np.flatnonzero(run_ends)[run_of_row]
    goes_on = ~columns[TERMINATEDS][last_of_row]
    steps_to_end = last_of_row - np.arange(len(last_of_row)) + 1
    return flat({
        OBS: columns[OBS],
        ACTIONS: columns[ACTIONS],
        VALUE_TARGETS: returns_to_go(columns[REWARDS], run_ends, gamma),
        BOOTSTRAP_OBS: columns[NEXT_OBS][last_of_row],
        BOOTSTRAP_DISCOUNT: np.where(goes_on, gamma ** steps_to_end.astype(np.float64), 0.0).astype(np.float32),
    })


@reads(Col.OBS, Col.ACTIONS, Col.REWARDS, Col.NEW_OBS, Col.TERMINATEDS, Col.EPS_ID, Col.T)
def with_n_step(rows: pa.Table, n: int, gamma: float) -> dict[str, np.ndarray]:
    """Transitions whose reward is the discounted sum of up to `n` steps and whose next observation, and
    termination, are those after the last of them: the n-step TD target r_t + ... + gamma^(k-1) r_(t+k-1)
    + gamma^k max_a Q(s_(t+k), a), with k = `N_STEP` <= n. k is smaller where the episode, or this batch's run
    of its steps, ends sooner; a k-step target is as valid as an n-step one.
    """
    columns = transitions(rows, (OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS))
    run_ends = episode_run_ends(column_to_numpy(rows[Col.EPS_ID]), column_to_numpy(rows[Col.T]))
    row = np.arange(len(run_ends))
    run_last_rows = np.flatnonzero(run_ends)
    steps = np.minimum(n, run_last_rows[np.searchsorted(run_last_rows, row)] - row + 1)
    rewards = columns[REWARDS]
    summed = np.zeros_like(rewards)
    for k in range(n):
        reaches = steps > k
        summed[reaches] += gamma**k * rewards[row[reaches] + k]
    last = row + steps - 1
    columns[REWARDS] = summed
    for name in (NEXT_OBS, TERMINATEDS):
        columns[name] = columns[name][last]
    columns[N_STEP] = steps.astype(np.float32)
    return flat(columns)


ONE_STEP_COLUMNS = (OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS)
ONE_STEP_READS = (Col.OBS, Col.ACTIONS, Col.REWARDS, Col.NEW_OBS, Col.TERMINATEDS)


@reads(*ONE_STEP_READS)
def one_step(rows: pa.Table) -> dict[str, np.ndarray]:
    """Transitions for one-step TD targets (IQL's, on discrete actions)."""
    return flat(transitions(rows, ONE_STEP_COLUMNS))


@reads(*ONE_STEP_READS)
def with_unit_actions(rows: pa.Table, low: np.ndarray, high: np.ndarray, margin: float = 0.0) -> dict[str, np.ndarray]:
    """Transitions with Box actions rescaled from the env's bounds to [-1, 1] (for CQL and IQL, whose tanh
    policies act there, see offline_cql.py), kept `margin` inside it."""
    columns = transitions(rows, ONE_STEP_COLUMNS)
    columns[ACTIONS] = unit_actions(columns[ACTIONS], low, high, margin)
    return flat(columns)


def unit_actions(actions: np.ndarray, low: np.ndarray, high: np.ndarray, margin: float) -> np.ndarray:
    """Box actions rescaled from the env's bounds to [-1, 1], where tanh-squashed policies act, kept `margin`
    inside it."""
    return np.clip(2.0 * (actions.astype(np.float32) - low) / (high - low) - 1.0, margin - 1.0, 1.0 - margin)
