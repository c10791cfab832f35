"""Train batches built from the dataset's columns with numpy, in place of RLlib's OfflinePreLearner.

RLlib's OfflinePreLearner turns every Parquet row into a one-step `SingleAgentEpisode` in Python and runs the
learner connector pipeline over those episodes, in a Ray actor that is started again (importing torch and
RLlib) at every pass over the data. On flat transition data that is the slowest step of offline training.
For MARWIL it is also wrong: with each row its own episode, the "returns" that weight actions are
r + gamma * V(s') with V frozen at the module's initial weights (the actor never receives updated weights),
and half of every batch is padding rows masked out of the loss.

`TransitionsData` and its subclasses map rows to the same flattened `default_policy/<column>` batch with
stateless numpy functions in Ray Data tasks; MARWIL's computes discounted returns-to-go over each episode, and
DQN's n-step returns.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.offline.offline_data import OfflineData

from collectors.dataset import Col, column_to_numpy

# Dataset column -> train batch column, for the columns every learner reads.
TRAIN_COLUMNS = {
    Col.OBS: Columns.OBS,
    Col.ACTIONS: Columns.ACTIONS,
    Col.REWARDS: Columns.REWARDS,
    Col.NEW_OBS: Columns.NEXT_OBS,
    Col.TERMINATEDS: Columns.TERMINATEDS,
    Col.TRUNCATEDS: Columns.TRUNCATEDS,
    Col.ACTION_LOGP: Columns.ACTION_LOGP,
}
FLOAT_COLUMNS = (Columns.OBS, Columns.NEXT_OBS, Columns.REWARDS, Columns.ACTION_LOGP)
# Steps in each row's TD target; RLlib's DQN learner discounts the bootstrap by gamma ** batch["n_step"].
N_STEP = "n_step"


def transitions(rows: pa.Table) -> dict[str, np.ndarray]:
    """The learner's columns of a batch of dataset rows, by their RLlib names (observations as 2-D arrays,
    converted by Arrow, not row by row)."""
    columns = {out: column_to_numpy(rows[col]) for col, out in TRAIN_COLUMNS.items() if col in rows.column_names}
    for name in FLOAT_COLUMNS:
        if name in columns:
            columns[name] = columns[name].astype(np.float32, copy=False)
    return columns


def flat(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Keyed by module, flattened, as RLlib's learners take offline batches."""
    return {f"{DEFAULT_MODULE_ID}/{name}": values for name, values in columns.items()}


def episode_run_ends(eps_id: np.ndarray, t: np.ndarray) -> np.ndarray:
    """True at each row that is the last of its run of consecutive steps of one episode in this batch."""
    run_ends = np.ones(len(eps_id), dtype=bool)
    run_ends[:-1] = (eps_id[1:] != eps_id[:-1]) | (t[1:] != t[:-1] + 1)
    return run_ends


def returns_to_go(rewards: np.ndarray, run_ends: np.ndarray, gamma: float) -> np.ndarray:
    """sum_k gamma^k r_{t+k} over the rest of each row's run."""
    out = np.empty(len(rewards), dtype=np.float32)
    running, last = 0.0, len(rewards) - 1
    # A loop over Python floats: about 10M rows/s, far ahead of any learner, and exact (a vectorised
    # gamma^-t rescaling overflows or loses precision on long episodes).
    for i, (reward, end) in enumerate(zip(reversed(rewards.tolist()), reversed(run_ends.tolist()))):
        running = reward + gamma * (0.0 if end else running)
        out[last - i] = running
    return out


def with_returns(rows: pa.Table, gamma: float) -> dict[str, np.ndarray]:
    """Transitions plus MARWIL's value targets: the behaviour policy's discounted returns-to-go.

    A batch can cut the episode at its end; those rows lack their future rewards, so the loss mask leaves them
    out. Episodes ended by the env's time limit are not bootstrapped: their returns stop there, as the
    behaviour policy's did.
    """
    columns = transitions(rows)
    run_ends = episode_run_ends(column_to_numpy(rows[Col.EPS_ID]), column_to_numpy(rows[Col.T]))
    done = columns[Columns.TERMINATEDS] | columns[Columns.TRUNCATEDS]
    run_of_row = np.concatenate([[0], np.cumsum(run_ends[:-1])])
    columns[Columns.VALUE_TARGETS] = returns_to_go(columns[Columns.REWARDS], run_ends, gamma)
    columns[Columns.LOSS_MASK] = done[run_ends][run_of_row]  # the run's last row ends the episode
    return flat(columns)


def with_n_step(rows: pa.Table, n: int, gamma: float) -> dict[str, np.ndarray]:
    """Transitions whose reward is the discounted sum of up to `n` steps and whose next observation, and
    termination, are those after the last of them: the n-step TD target r_t + ... + gamma^(k-1) r_(t+k-1)
    + gamma^k max_a Q(s_(t+k), a), with k = `N_STEP` <= n. k is smaller where the episode, or this batch's run
    of its steps, ends sooner; a k-step target is as valid as an n-step one.
    """
    columns = transitions(rows)
    run_ends = episode_run_ends(column_to_numpy(rows[Col.EPS_ID]), column_to_numpy(rows[Col.T]))
    row = np.arange(len(run_ends))
    run_last_rows = np.flatnonzero(run_ends)
    steps = np.minimum(n, run_last_rows[np.searchsorted(run_last_rows, row)] - row + 1)
    rewards = columns[Columns.REWARDS]
    summed = np.zeros_like(rewards)
    for k in range(n):
        reaches = steps > k
        summed[reaches] += gamma**k * rewards[row[reaches] + k]
    last = row + steps - 1
    columns[Columns.REWARDS] = summed
    for name in (Columns.NEXT_OBS, Columns.TERMINATEDS, Columns.TRUNCATEDS):
        columns[name] = columns[name][last]
    columns[N_STEP] = steps.astype(np.float32)
    return flat(columns)


def with_unit_actions(rows: pa.Table, low: np.ndarray, high: np.ndarray) -> dict[str, np.ndarray]:
    """Transitions with Box actions rescaled from the env's bounds to [-1, 1] (for CQL, see offline_cql.py)."""
    columns = transitions(rows)
    actions = columns[Columns.ACTIONS].astype(np.float32)
    columns[Columns.ACTIONS] = np.clip(2.0 * (actions - low) / (high - low) - 1.0, -1.0, 1.0)
    return flat(columns)


class InMemoryBatches:
    """A mapped dataset held as tensors, read in shuffled passes: what a replay buffer does, and the plain torch
    loop the throughput benchmark compares with.

    It stands in for the `ray.data.DataIterator` that RLlib's learner reads (`iter_torch_batches`), so each
    batch is one index lookup per column, with no Ray Data pipeline between updates. Each pass is a fresh
    permutation of all rows (a global shuffle, where streaming has a buffer's); the rows a pass leaves over
    (fewer than a batch) wait for the next.
    """

    def __init__(self, data, seed: int | None):
        blocks = list(data.iter_batches(batch_size=None, batch_format="numpy"))
        self.columns = {name: torch.from_numpy(np.concatenate([block[name] for block in blocks]))
                        for name in blocks[0]}
        self.rows = len(next(iter(self.columns.values())))
        self.generator = torch.Generator().manual_seed(seed or 0)
        self.batch_size, self.device = 0, "cpu"

    def iter_torch_batches(self, *, batch_size: int, device="cpu", **_ray_data_kwargs) -> "InMemoryBatches":
        """The batches to read, as `ray.data.DataIterator.iter_torch_batches` gives them; shuffle settings
        are for streaming."""
        self.batch_size, self.device = batch_size, device
        return self

    def __iter__(self):
        order = torch.randperm(self.rows, generator=self.generator)
        # A dataset smaller than a batch is read whole; a pass that yielded nothing would make RLlib wait forever.
        for start in range(0, max(self.rows - self.batch_size + 1, 1), self.batch_size):
            picked = order[start:start + self.batch_size]
            yield {name: values[picked].to(self.device) for name, values in self.columns.items()}


class TransitionsData(OfflineData):
    """RLlib's OfflineData with the rows mapped by a stateless function in Ray Data tasks, instead of an
    OfflinePreLearner actor."""

    def __init__(self, config):
        super().__init__(config)
        # RLlib's concurrency (actors in the pool) reads here as concurrent tasks.
        self.data = self.data.map_batches(self.to_train_batch, fn_kwargs=self.batch_kwargs(config),
                                          batch_size=self.read_rows(config), batch_format="pyarrow",
                                          **self.map_batches_kwargs)
        self.data_is_mapped = True  # OfflineData.sample must not map again
        # Small datasets are mapped once: held by a local learner as tensors, else in the object store.
        self.in_memory = None
        if config.materialize_mapped_data and config.num_learners == 0:
            self.in_memory = InMemoryBatches(self.data, seed=config.seed)
        elif config.materialize_mapped_data:
            self.data = self.data.materialize()

    def sample(self, num_samples, return_iterator=False, num_shards=1, module_state=None):
        if self.in_memory is not None and return_iterator:
            return [self.in_memory]
        return super().sample(num_samples, return_iterator=return_iterator, num_shards=num_shards,
                              module_state=module_state)

    @staticmethod
    def to_train_batch(rows: pa.Table) -> dict[str, np.ndarray]:
        return flat(transitions(rows))

    def batch_kwargs(self, config) -> dict:
        return {}

    def read_rows(self, config) -> int | None:
        """Rows per call; None maps each block as read (batching happens after the shuffle buffer)."""
        return None


class ReturnsData(TransitionsData):
    """For MARWIL: reads `returns_read_rows` rows at a time, so that few episodes are cut by a read."""

    to_train_batch = staticmethod(with_returns)

    def batch_kwargs(self, config) -> dict:
        return {"gamma": config.gamma}

    def read_rows(self, config) -> int:
        return config.returns_read_rows


class NStepData(TransitionsData):
    """For DQN: n-step transitions (`config.n_step`)."""

    to_train_batch = staticmethod(with_n_step)

    def batch_kwargs(self, config) -> dict:
        return {"n": config.n_step, "gamma": config.gamma}


class UnitActionsData(TransitionsData):
    to_train_batch = staticmethod(with_unit_actions)

    def batch_kwargs(self, config) -> dict:
        return {"low": config.action_space.low, "high": config.action_space.high}
