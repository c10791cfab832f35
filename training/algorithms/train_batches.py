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

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from ray.data import TaskPoolStrategy
from ray.rllib.offline.offline_data import OfflineData

import dataset_format as dataset
from training.algorithms.rllib_internals import offline_data_map_kwargs, offline_data_rows, set_offline_data_mapped


class InMemoryBatches:
    """Mapped columns held as tensors, read in shuffled passes: what a replay buffer does, and the plain torch
    loop the throughput benchmark compares with.

    It stands in for the `ray.data.DataIterator` that RLlib's learner reads (`iter_torch_batches`), so each
    batch is one index lookup per column, with no Ray Data pipeline between updates. Each pass is a fresh
    permutation of all rows (a global shuffle, where streaming has a buffer's); the rows a pass leaves over
    (fewer than a batch) wait for the next.
    """

    def __init__(self, columns: dict[str, np.ndarray], seed: int | None):
        # Columns Arrow handed over without a copy are read-only, which torch warns about.
        self.columns = {name: torch.from_numpy(values if values.flags.writeable else values.copy())
                        for name, values in columns.items()}
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


@dataclass(frozen=True)
class BatchPlan:
    """How an algorithm's learner batches are made from dataset rows: a batch_columns function and its
    arguments, applied to `read_rows` rows at a time (None: each block as read)."""

    to_train_batch: Callable[..., dict[str, np.ndarray]]
    kwargs: dict = field(default_factory=dict)
    read_rows: int | None = None


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
        map_kwargs["compute"] = TaskPoolStrategy(size=map_kwargs.pop("concurrency"))
        data = data.map_batches(self.plan.to_train_batch, fn_kwargs=self.plan.kwargs, batch_size=self.plan.read_rows,
                                batch_format="pyarrow", **map_kwargs)
        # Small datasets are mapped once. A local learner reads and maps them in its own process, all rows at
        # once (no episode is cut), and holds them as tensors: no Ray Data workers to start. Remote learners
        # share them through the object store. Like Ray Data's reads, this one leaves validation to the caller.
        self.in_memory = None
        if config.materialize_mapped_data and config.num_learners == 0:
            rows = dataset.read_table(self.location)
            self.in_memory = InMemoryBatches(self.plan.to_train_batch(rows, **self.plan.kwargs), config.seed)
        elif config.materialize_mapped_data:
            data = data.materialize()
        else:  # streams: Ray Data reads ahead of the learner within this object-store budget, in blocks of this size
            options = data.context.execution_options
            options.resource_limits = options.resource_limits.copy(object_store_memory=self.stream.read_ahead_bytes)
            data.context.target_max_block_size = self.stream.block_bytes
        set_offline_data_mapped(self, data)  # OfflineData.sample must not map again

    def sample(self, num_samples, return_iterator=False, num_shards=1, module_state=None):
        if self.in_memory is not None and return_iterator:
            return [self.in_memory]
        return super().sample(num_samples, return_iterator=return_iterator, num_shards=num_shards,
                              module_state=module_state)
