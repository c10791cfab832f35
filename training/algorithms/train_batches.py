"""Train batches built from the dataset's columns with numpy, read by each learner in its own process, in place of
RLlib's OfflinePreLearner and Ray Data pipeline.

RLlib's OfflinePreLearner turns every Parquet row into a one-step `SingleAgentEpisode` in Python and runs the
learner connector pipeline over those episodes, in a Ray actor that is started again (importing torch and
RLlib) at every pass over the data. On flat transition data that is the slowest step of offline training.
For MARWIL it is also wrong: with each row its own episode, the "returns" that weight actions are
r + gamma * V(s') with V frozen at the module's initial weights (the actor never receives updated weights),
and half of every batch is padding rows masked out of the loss.

Rows become the flattened `default_policy/<column>` batch each learner reads through the stateless numpy function
of the algorithm's `BatchPlan` (training/algorithms/batch_columns.py): BC's observations and actions, MARWIL's
discounted returns-to-go over each episode, DQN's n-step returns. A small dataset is read once and held
(`InMemoryBatches`); a larger one streams from its row groups at each pass (`StreamedBatches`). Each is sent to
its learner small and reads there, from the files: no Ray Data tasks, and nothing in Ray's object store.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
from ray.rllib.offline.offline_data import OfflineData
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

import dataset_format as dataset
from common.observations import ModelInput
from training.algorithms.batch_columns import DEFAULT_MODULE_ID, OBSERVATION_COLUMNS, network_observations


class InMemoryBatches:
    """One learner's share of a small dataset's train batches, held as tensors and read in shuffled passes: what a
    replay buffer does, and the plain torch loop the throughput benchmark compares with.

    It stands in for the `ray.data.DataIterator` that RLlib's learner reads (`iter_torch_batches`), so each
    batch is one index lookup per column, with no Ray Data pipeline between updates. It is sent to its learner
    small and reads its rows there, on first use, from the dataset's files: every row is mapped (no episode is
    cut) and shard `shard` of `num_shards` keeps every `num_shards`-th one. Learner actors so hold no object in
    Ray's object store, and need no CPU beside their own: a lost node takes no other learner's data with it.
    Each pass is a fresh permutation of the shard's rows (a global shuffle, where streaming has a buffer's); the
    rows a pass leaves over (fewer than a batch) wait for the next.
    """

    def __init__(self, location: dataset.Location, plan: BatchPlan, seed: int | None, shard: int = 0,
                 num_shards: int = 1):
        self.location, self.plan, self.shard, self.num_shards = location, plan, shard, num_shards
        self.seed = (seed or 0) + shard
        self.columns: dict[str, torch.Tensor] | None = None
        self.frames: HeldFrames | None = None
        self.batch_size, self.device = 0, torch.device("cpu")

    def load(self) -> InMemoryBatches:
        """Reads and maps the rows (once); this learner's share stays."""
        if self.columns is None:
            mapped, store = self.plan.held_batch(self.location)
            self.columns = {name: _tensor(values[self.shard::self.num_shards]) for name, values in mapped.items()}
            self.frames = None if store is None else HeldFrames.of(store)
            self.generator = torch.Generator().manual_seed(self.seed)
        return self

    @property
    def rows(self) -> int:
        return len(next(iter(self.load().columns.values())))

    def iter_torch_batches(self, *, batch_size: int, device="cpu", **_ray_data_kwargs) -> InMemoryBatches:
        """The batches to read, as `ray.data.DataIterator.iter_torch_batches` gives them; shuffle settings
        are for streaming."""
        self.batch_size = batch_size
        self._hold_on(torch.device(device))
        return self

    def _hold_on(self, device: torch.device) -> None:
        """Moves the held rows to the learner's device, once: each batch is then gathered where the network runs,
        and on a GPU no row crosses from the host after the first pass (as the plain torch loop holds its data)."""
        self.load()
        if device != self.device:
            self.columns = {name: values.to(device) for name, values in self.columns.items()}
            self.frames = None if self.frames is None else self.frames.to(device)
            self.device = device

    def __iter__(self):
        rows = self.rows
        order = torch.randperm(rows, generator=self.generator).to(self.device)
        # A shard smaller than a batch is read whole; a pass that yielded nothing would make RLlib wait forever.
        for start in range(0, max(rows - self.batch_size + 1, 1), self.batch_size):
            picked = order[start:start + self.batch_size]
            batch = {name: values[picked] for name, values in self.columns.items()}
            yield batch if self.frames is None else self.plan.network_batch(batch, self.frames)


class StreamedBatches:
    """A learner's stream of a large dataset's train batches, read from the Parquet files in the learner's own
    process at each pass: its row groups (runs of them of `plan.read_rows` rows or more) in a fresh order, read and
    mapped by a thread up to `read_ahead_bytes` ahead of the learner, into a shuffle buffer that keeps
    `local_shuffle_buffer_size` rows. Each run read joins the buffer, and batches drawn at random from all of it
    (by tensor indexing) take it back down to that size, so every batch mixes the rows of many runs read before,
    from all over the files. Draining the buffer whole at each run instead gave a row group's worth of
    consecutive updates (500 of IQL's over 131,072 rows) from one stretch of the data, which lowered IQL's score on
    an online run's logged experience (benchmarks/mujoco.md, "IQL's gap on halfcheetah-medium-replay"). A pass
    ends with the whole buffer, its last batch short: each row once a pass.

    Ray Data's stream, which it replaced, did not stream frames: its first batch came after the whole read
    (benchmarks/throughput.md, "Frames streamed"). Shard `shard` of `num_shards` reads every `num_shards`-th run of row
    groups; where there are fewer runs than shards, each shard reads them all and keeps every `num_shards`-th row.
    """

    def __init__(self, location: dataset.Location, plan: BatchPlan, seed: int | None, read_ahead_bytes: int,
                 shard: int = 0, num_shards: int = 1):
        self.location, self.plan, self.read_ahead_bytes = location, plan, read_ahead_bytes
        self.shard, self.num_shards = shard, num_shards
        self.generator = torch.Generator().manual_seed((seed or 0) + shard)
        self.runs: list[dataset.RowGroups] | None = None  # listed on first use, in the learner's process
        self.rows_kept = slice(None)
        self.batch_size, self.buffer_rows, self.device = 0, 0, "cpu"

    def iter_torch_batches(self, *, batch_size: int, device="cpu", local_shuffle_buffer_size: int | None = None,
                           **_ray_data_kwargs) -> StreamedBatches:
        """The batches to read, as `ray.data.DataIterator.iter_torch_batches` gives them."""
        self.batch_size, self.device = batch_size, device
        self.buffer_rows = max(local_shuffle_buffer_size or 0, batch_size)
        return self

    def __iter__(self):
        runs = self._runs()
        order = torch.randperm(len(runs), generator=self.generator).tolist()
        read_ahead = max(1, self.read_ahead_bytes // max(1, max(run.bytes for run in runs)))
        held: list[dict[str, torch.Tensor]] = []
        rows = 0
        for number, part in enumerate(read_in_order(self._mapped, [runs[i] for i in order], read_ahead)):
            held.append(part)
            rows += _length(part)
            last = number == len(runs) - 1
            if rows < self.buffer_rows + self.batch_size and not last:
                continue
            buffer = {name: torch.cat([part[name] for part in held]) for name in held[0]}
            shuffled = torch.randperm(rows, generator=self.generator)
            drawn = rows if last else (rows - self.buffer_rows) // self.batch_size * self.batch_size
            for start in range(0, drawn, self.batch_size):
                picked = shuffled[start:start + self.batch_size]
                yield self.plan.on_device({name: values[picked] for name, values in buffer.items()}, self.device)
            held, rows = [{name: values[shuffled[drawn:]] for name, values in buffer.items()}], rows - drawn

    def _runs(self) -> list[dataset.RowGroups]:
        if self.runs is None:
            runs = dataset.row_group_runs(self.location, self.plan.read_rows)
            if len(runs) >= self.num_shards:
                self.runs = runs[self.shard::self.num_shards]
            else:
                self.runs, self.rows_kept = runs, slice(self.shard, None, self.num_shards)
        return self.runs

    def _mapped(self, run: dataset.RowGroups) -> dict[str, torch.Tensor]:
        """The train batch columns of a run's rows (this shard's share of them), as tensors."""
        batch = self.plan.train_batch(dataset.read_row_groups(self.location, run, self.plan.columns))
        return {name: _tensor(values[self.rows_kept]) for name, values in batch.items()}


def read_in_order(read: Callable, items: list, ahead: int) -> Iterator:
    """`read(item)` of each item in order, read by a thread up to `ahead` items ahead of the caller. Parquet's
    decoding and numpy release the GIL, so reading overlaps the learner's updates."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orl-stream")
    pending: deque = deque()
    try:
        for item in items:
            pending.append(pool.submit(read, item))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:  # the learner stopped reading: no more reads
        for future in pending:
            future.cancel()
        pool.shutdown(wait=False)


def _length(batch: dict[str, torch.Tensor]) -> int:
    return len(next(iter(batch.values())))


def _tensor(values: np.ndarray) -> torch.Tensor:
    # Columns Arrow handed over without a copy are read-only, which torch warns about.
    return torch.from_numpy(values if values.flags.writeable and values.flags.c_contiguous else values.copy())


@dataclass(frozen=True)
class BatchPlan:
    """How an algorithm's learner batches are made from dataset rows: a batch_columns function and its
    arguments, applied to `read_rows` rows at a time (None: each row group as read; held in memory, all at once),
    then observations made the network's input (`model_input`, set by `rllib_config` for images and Discrete
    observations)."""

    to_train_batch: Callable[..., dict[str, np.ndarray]]
    kwargs: dict = field(default_factory=dict)
    read_rows: int | None = None
    model_input: ModelInput | None = None

    @property
    def frames(self) -> bool:
        """Image observations: they travel as stored (uint8) and become the network's input on the learner's
        device, a quarter of the bytes of the float32 input to hold, stream and copy."""
        return self.model_input is not None and not self.model_input.one_hot

    @property
    def columns(self) -> tuple[str, ...]:
        """The dataset columns its batch function reads, the only ones read."""
        return self.to_train_batch.columns

    def train_batch(self, rows) -> dict[str, np.ndarray]:
        """Rows mapped to the learner's batch columns; images stay as stored."""
        batch = self.to_train_batch(rows, **self.kwargs)
        return batch if self.frames else network_observations(batch, self.model_input)

    def on_device(self, batch: dict[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
        """A batch on `device`, its images (as stored) made the network's input there."""
        return {name: self.model_input.on_tensor(values.to(device)) if self.frames and name in OBSERVATION_COLUMNS
                else values.to(device) for name, values in batch.items()}

    def held_batch(self, location: dataset.Location) -> tuple[dict[str, np.ndarray], dataset.FrameStore | None]:
        """The whole dataset's batch columns, to hold in memory. Images stay as ids into the returned frames, each
        distinct frame held once, and become the network's input batch by batch (`network_batch`); a 4-frame
        stack would otherwise hold eight frames per transition, as float32."""
        if not self.frames:
            return self.train_batch(dataset.read_table(location, self.columns)), None
        frames, rows = dataset.read_frames(location, self.model_input.channels_first)
        return self.to_train_batch(rows, **self.kwargs), frames

    def network_batch(self, batch: dict[str, torch.Tensor], frames: HeldFrames) -> dict[str, torch.Tensor]:
        """A batch of `held_batch`'s columns, its observation ids made the network's input on the device that holds
        `frames` and the batch: frames gathered and made float32 where the network runs."""
        return self.on_device({name: frames[ids] if name in OBSERVATION_COLUMNS else ids
                               for name, ids in batch.items()}, frames.frames.device)


@dataclass(frozen=True)
class HeldFrames:
    """A dataset's `FrameStore` as tensors, on the device where a learner gathers its batches' observations."""

    frames: torch.Tensor
    stacks: torch.Tensor
    channels_first: bool

    @classmethod
    def of(cls, store: dataset.FrameStore) -> HeldFrames:
        return cls(_tensor(store.frames), torch.from_numpy(store.stacks).long(), store.channels_first)

    def to(self, device: torch.device) -> HeldFrames:
        return HeldFrames(self.frames.to(device), self.stacks.to(device), self.channels_first)

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        """The observations of `ids`, at the shape the dataset stores (as `FrameStore[ids]`)."""
        stacked = self.frames[self.stacks[ids]]
        return stacked if self.channels_first else stacked.movedim(1, -1).contiguous()


class TransitionsData(OfflineData):
    """RLlib's OfflineData, as the source of each learner's batches: `InMemoryBatches` where the dataset is held in
    memory (`materialize_mapped_data`), else `StreamedBatches`, each reading its share of the files in the learner's
    process. RLlib builds it from the config alone, so `for_plan` binds the batch plan, the stream's read-ahead and
    the dataset's location to a subclass that the config names."""

    plan: BatchPlan
    read_ahead_bytes: int
    location: dataset.Location

    @classmethod
    def for_plan(cls, plan: BatchPlan, read_ahead_bytes: int, location: dataset.Location) -> type[TransitionsData]:
        return type(cls.__name__, (cls,), {"plan": plan, "read_ahead_bytes": read_ahead_bytes, "location": location})

    def __init__(self, config):
        # Not OfflineData.__init__, which opens the files as a Ray Dataset: the learners read them themselves.
        # What RLlib reads of an OfflineData is `sample` and these settings, which its training step passes on.
        self.config = config
        self.iter_batches_kwargs = dict(config.iter_batches_kwargs)
        self.in_memory = config.materialize_mapped_data
        self.one_at_a_time: Iterator | None = None  # the batches `sample` hands out singly

    def sample(self, num_samples, return_iterator=False, num_shards=1, module_state=None):
        """One source of batches per learner (RLlib asks for 0 shards for a learner in this process) or, where RLlib
        updates once per iteration in this process, one batch, which its learner moves to its device."""
        if return_iterator:
            shards = max(num_shards, 1)
            return [self._source(shard, shards) for shard in range(shards)]
        if self.one_at_a_time is None:
            self.one_at_a_time = _endless(self._source(0, 1).iter_torch_batches(batch_size=num_samples,
                                                                                **self.iter_batches_kwargs))
        batch = {name.split("/", 1)[1]: values for name, values in next(self.one_at_a_time).items()}
        return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=_length(batch))

    def _source(self, shard: int, num_shards: int) -> InMemoryBatches | StreamedBatches:
        """Shard `shard` of `num_shards`'s batches, held or streamed."""
        if self.in_memory:
            return InMemoryBatches(self.location, self.plan, self.config.seed, shard, num_shards)
        return StreamedBatches(self.location, self.plan, self.config.seed, self.read_ahead_bytes, shard, num_shards)


def _endless(passes: Iterable) -> Iterator:
    while True:
        yield from passes


def release_data_iterator(learner) -> None:
    """Drops a learner's batch iterator in the learner's own process, while Ray is still up there: a stream stops
    its reading thread and lets go of the rows it read ahead."""
    learner.iterator = None
    gc.collect()
