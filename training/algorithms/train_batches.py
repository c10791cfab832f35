"""Train batches built from the dataset's columns with numpy, in place of RLlib's OfflinePreLearner.

RLlib's OfflinePreLearner turns every Parquet row into a one-step `SingleAgentEpisode` in Python and runs the
learner connector pipeline over those episodes, in a Ray actor that is started again (importing torch and
RLlib) at every pass over the data. On flat transition data that is the slowest step of offline training.
For MARWIL it is also wrong: with each row its own episode, the "returns" that weight actions are
r + gamma * V(s') with V frozen at the module's initial weights (the actor never receives updated weights),
and half of every batch is padding rows masked out of the loss.

`TransitionsData` maps rows to the flattened `default_policy/<column>` batch each learner reads, with the
stateless numpy function of the algorithm's `BatchPlan` (training/algorithms/batch_columns.py), in Ray Data
tasks: BC's observations and actions, MARWIL's discounted returns-to-go over each episode, DQN's n-step
returns.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import ray
import torch
from ray.data import TaskPoolStrategy
from ray.rllib.offline.offline_data import OfflineData

import dataset_format as dataset
from common.errors import UserError
from common.observations import ModelInput
from training.algorithms.batch_columns import OBSERVATION_COLUMNS, network_observations
from training.algorithms.rllib_internals import offline_data_map_kwargs, offline_data_rows, set_offline_data_mapped


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
        self.frames: dataset.FrameStore | None = None
        self.batch_size, self.device = 0, "cpu"

    def load(self) -> InMemoryBatches:
        """Reads and maps the rows (once); this learner's share stays."""
        if self.columns is None:
            mapped, self.frames = self.plan.held_batch(self.location)
            shares = {name: values[self.shard::self.num_shards] for name, values in mapped.items()}
            # Columns Arrow handed over without a copy are read-only, which torch warns about.
            self.columns = {name: torch.from_numpy(share if share.flags.writeable and share.flags.c_contiguous
                                                   else share.copy()) for name, share in shares.items()}
            self.generator = torch.Generator().manual_seed(self.seed)
        return self

    @property
    def rows(self) -> int:
        return len(next(iter(self.load().columns.values())))

    def iter_torch_batches(self, *, batch_size: int, device="cpu", **_ray_data_kwargs) -> InMemoryBatches:
        """The batches to read, as `ray.data.DataIterator.iter_torch_batches` gives them; shuffle settings
        are for streaming."""
        self.batch_size, self.device = batch_size, device
        return self

    def __iter__(self):
        rows = self.rows
        order = torch.randperm(rows, generator=self.generator)
        # A shard smaller than a batch is read whole; a pass that yielded nothing would make RLlib wait forever.
        for start in range(0, max(rows - self.batch_size + 1, 1), self.batch_size):
            picked = order[start:start + self.batch_size]
            batch = {name: values[picked] for name, values in self.columns.items()}
            if self.frames is not None:
                yield self.plan.network_batch(batch, self.frames, self.device)
            else:
                yield {name: values.to(self.device) for name, values in batch.items()}


class StreamedBatches:
    """A learner's stream of a large dataset's train batches: chunks of `local_shuffle_buffer_size` rows that Ray
    Data reads and maps ahead of the learner, each shuffled with the rows the previous one left over and cut into
    batches by tensor indexing.

    It stands in for the `ray.data.DataIterator` RLlib's learner reads, and wraps it: Ray Data's own local shuffle
    buffer concatenates and slices Arrow blocks for every batch, the slowest part of streaming small rows. A pass
    ends with the rows left over, fewer than a batch.
    """

    def __init__(self, rows, plan: BatchPlan, seed: int | None):
        self.rows, self.plan, self.generator = rows, plan, torch.Generator().manual_seed(seed or 0)
        self.batch_size, self.buffer_rows, self.device = 0, 0, "cpu"

    def iter_torch_batches(self, *, batch_size: int, device="cpu", local_shuffle_buffer_size: int | None = None,
                           **_ray_data_kwargs) -> StreamedBatches:
        self.batch_size, self.device = batch_size, device
        self.buffer_rows = max(local_shuffle_buffer_size or 0, batch_size)
        return self

    def __iter__(self):
        left: dict[str, torch.Tensor] = {}
        for chunk in self.rows.iter_torch_batches(batch_size=self.buffer_rows, prefetch_batches=1):
            if left:
                chunk = {name: torch.cat([left[name], values]) for name, values in chunk.items()}
            rows = len(next(iter(chunk.values())))
            order = torch.randperm(rows, generator=self.generator)
            whole = rows - rows % self.batch_size
            for start in range(0, whole, self.batch_size):
                picked = order[start:start + self.batch_size]
                yield self.plan.on_device({name: values[picked] for name, values in chunk.items()}, self.device)
            left = {name: values[order[whole:]] for name, values in chunk.items()}
        if left and len(next(iter(left.values()))):
            yield self.plan.on_device(left, self.device)


@dataclass(frozen=True)
class BatchPlan:
    """How an algorithm's learner batches are made from dataset rows: a batch_columns function and its
    arguments, applied to `read_rows` rows at a time (None: each block as read), then observations made the
    network's input (`model_input`, set by `rllib_config` for images and Discrete observations)."""

    to_train_batch: Callable[..., dict[str, np.ndarray]]
    kwargs: dict = field(default_factory=dict)
    read_rows: int | None = None
    model_input: ModelInput | None = None

    @property
    def frames(self) -> bool:
        """Image observations: they travel as stored (uint8) and become the network's input on the learner's
        device, a quarter of the bytes of the float32 input to hold, stream and copy."""
        return self.model_input is not None and not self.model_input.one_hot

    def train_batch(self, rows) -> dict[str, np.ndarray]:
        """Rows mapped to the learner's batch columns (in Ray Data tasks when streaming); images stay as stored."""
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
            return self.train_batch(dataset.read_table(location)), None
        frames, rows = dataset.read_frames(location, self.model_input.channels_first)
        return self.to_train_batch(rows, **self.kwargs), frames

    def network_batch(self, batch: dict[str, torch.Tensor], frames: dataset.FrameStore,
                      device: torch.device | str) -> dict[str, torch.Tensor]:
        """A batch of `held_batch`'s columns on `device`, its observation ids made the network's input there: the
        frames travel as uint8 and become float32 where the network runs (on a GPU, a quarter of the bytes to copy,
        and the conversion off the CPU)."""
        return self.on_device({name: torch.from_numpy(frames[ids.numpy()]) if name in OBSERVATION_COLUMNS else ids
                               for name, ids in batch.items()}, device)


@dataclass(frozen=True)
class StreamSettings:
    """Ray Data's memory budget and block size for datasets that stream (RLlib's config has no setting for
    either)."""

    read_ahead_bytes: int
    block_bytes: int


class TransitionsData(OfflineData):
    """RLlib's OfflineData with the rows mapped by a stateless function in Ray Data tasks, instead of an
    OfflinePreLearner actor. RLlib builds it from the config alone, so `for_plan` binds the batch plan, stream
    settings and the dataset's location to a subclass that the config names."""

    plan: BatchPlan
    stream: StreamSettings
    location: dataset.Location

    @classmethod
    def for_plan(cls, plan: BatchPlan, stream: StreamSettings, location: dataset.Location) -> type[TransitionsData]:
        return type(cls.__name__, (cls,), {"plan": plan, "stream": stream, "location": location})

    def __init__(self, config):
        super().__init__(config)
        data = offline_data_rows(self)
        map_kwargs = dict(offline_data_map_kwargs(self))
        # RLlib's `concurrency` (actors in its pre-learner pool) reads here as a pool of tasks, named as Ray Data
        # now asks (it deprecated `concurrency`).
        map_cpus = map_kwargs["num_cpus"] * map_kwargs["concurrency"]
        map_kwargs["compute"] = TaskPoolStrategy(size=map_kwargs.pop("concurrency"))
        data = data.map_batches(self.plan.train_batch, batch_size=self.plan.read_rows, batch_format="pyarrow",
                                **map_kwargs)
        # Small datasets are mapped once and held as tensors by each learner (InMemoryBatches): no Ray Data
        # workers to start, and nothing in the object store. Larger ones stream.
        self.in_memory = config.materialize_mapped_data
        if not self.in_memory:  # Ray Data reads ahead of the learner within this object-store budget, in blocks
            require_cpus_to_stream(config, map_cpus)
            options = data.context.execution_options
            options.resource_limits = options.resource_limits.copy(object_store_memory=self.stream.read_ahead_bytes)
            data.context.target_max_block_size = self.stream.block_bytes
        set_offline_data_mapped(self, data)  # OfflineData.sample must not map again

    def sample(self, num_samples, return_iterator=False, num_shards=1, module_state=None):
        if self.in_memory and return_iterator:  # RLlib asks for 0 shards for a learner in this process
            return [InMemoryBatches(self.location, self.plan, self.config.seed, shard, max(num_shards, 1))
                    for shard in range(max(num_shards, 1))]
        if return_iterator:
            streams = super().sample(num_samples, return_iterator=True, num_shards=num_shards)
            shards = streams if isinstance(streams, list) else [streams]
            return [StreamedBatches(rows, self.plan, (self.config.seed or 0) + shard)
                    for shard, rows in enumerate(shards)]
        return super().sample(num_samples, return_iterator=return_iterator, num_shards=num_shards,
                              module_state=module_state)


def require_cpus_to_stream(config, map_cpus: float) -> None:
    """Streaming needs CPUs for its Ray Data map tasks (`map_cpus` in all) beside the learner actors' own; without
    them it waits forever."""
    learner_cpus = config.num_learners * (1 if config.num_cpus_per_learner == "auto" else config.num_cpus_per_learner)
    cluster_cpus = ray.cluster_resources().get("CPU", 0)
    if learner_cpus + map_cpus > cluster_cpus:
        raise UserError(f"streaming this dataset needs {learner_cpus:g} CPUs for {config.num_learners} learners and "
                        f"{map_cpus:g} for map_tasks, and Ray has {cluster_cpus:g}: lower num_learners or map_tasks, "
                        "add CPUs, or raise memory_cache_mib to hold the dataset in memory")


def release_data_iterator(learner) -> None:
    """Closes a learner's Ray Data iterator in the learner's own process, while Ray is still up there.

    Left to the interpreter's exit, the iterator's generator is closed after Ray's shutdown; Ray Data's cleanup then
    reports stats, which initializes Ray again inside the exiting learner actor and crashes it ("Check failed:
    !core_worker_process", core_worker_process.cc:92, Ray 2.60), with tracebacks on the driver's console."""
    learner.iterator = None
    gc.collect()
