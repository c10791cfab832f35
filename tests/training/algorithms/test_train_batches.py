"""Train batches built from columns: the same batches RLlib's pre-learner builds, and MARWIL's true returns."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import dataset_format as dataset
from common.errors import UserError
from dataset_format import Col
from pipelines.params import load_params
from tests.conftest import write_frame_stacks
from training.algorithms import batch_columns
from training.algorithms.batch_columns import N_STEP, cloning_batch, flat, transitions, with_n_step, with_returns
from training.algorithms.registry import rllib_config
from training.algorithms.train_batches import InMemoryBatches, StreamedBatches, release_data_iterator

GAMMA = 0.5


def _rows(path, start: int, n: int) -> pa.Table:
    return pq.read_table(path / dataset.read_card(path).files[0]["path"]).slice(start, n)


def test_transitions_equal_rllib_prelearner_batches(mixture_dataset):
    """Byte-for-byte the batch RLlib's OfflinePreLearner builds through one-step episodes and its connectors."""
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner

    spaces = dataset.read_card(mixture_dataset).spaces
    config = rllib_config("bc", load_params("params.yaml").algos.bc, mixture_dataset, seed=0)
    config.rl_module(rl_module_spec=config.get_multi_rl_module_spec(spaces={"default_policy": spaces}))
    rows = _rows(mixture_dataset, 5, 300)
    rllib_batch = OfflinePreLearner(config=config, spaces=spaces)(
        {name: rows[name].to_numpy() for name in rows.column_names})  # as Ray Data hands it numpy batches
    ours = flat(transitions(rows))

    assert sorted(ours) == sorted(rllib_batch)
    for key, values in rllib_batch.items():
        np.testing.assert_array_equal(ours[key], values.numpy(), err_msg=key)
        assert ours[key].dtype == values.numpy().dtype, key


def _two_episodes() -> pa.Table:
    """Episode 7 started before this batch (t = 3, 4) and ends here; episode 8 runs out of the batch."""
    new_obs = np.repeat(np.arange(5, dtype=np.float32), 2)  # row i's next observation is [i, i]
    return pa.table({
        Col.EPS_ID: [7, 7, 8, 8, 8], Col.T: [3, 4, 0, 1, 2], Col.ACTIONS: [0] * 5,
        Col.OBS: pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(10, dtype=np.float32)), 2),
        Col.NEW_OBS: pa.FixedSizeListArray.from_arrays(pa.array(new_obs), 2),
        Col.REWARDS: [1.0, 2.0, 4.0, 8.0, 16.0],
        Col.TERMINATEDS: [False, True, False, False, False], Col.TRUNCATEDS: [False] * 5,
    })


def test_batch_columns_use_rllibs_names_without_importing_torch_or_rllib():
    """batch_columns is plain numpy over Arrow: usable (and testable) without a learner."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.columns import Columns

    assert batch_columns.DEFAULT_MODULE_ID == DEFAULT_MODULE_ID
    for name in ("OBS", "NEXT_OBS", "ACTIONS", "REWARDS", "TERMINATEDS", "TRUNCATEDS", "ACTION_LOGP",
                 "VALUE_TARGETS"):
        assert getattr(batch_columns, name) == getattr(Columns, name), name
    imported = subprocess.run([sys.executable, "-c", "import sys, training.algorithms.batch_columns; "
                               "print(sorted({'torch', 'ray.rllib'} & set(sys.modules)))"],
                              capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]"


def test_returns_to_go_within_episodes_and_bootstrapped_where_the_batch_cuts_an_episode():
    out = with_returns(_two_episodes(), gamma=GAMMA)
    np.testing.assert_allclose(out["default_policy/value_targets"], [1 + 0.5 * 2, 2, 4 + 4 + 4, 8 + 8, 16])
    # The learner adds discount * V(bootstrap_obs): 0 for the terminated episode 7; episode 8 goes on after the
    # batch, from its last new_obs ([4, 4]), gamma^(steps to it) away.
    np.testing.assert_allclose(out["default_policy/bootstrap_discount"], [0, 0, 0.5 ** 3, 0.5 ** 2, 0.5])
    np.testing.assert_array_equal(out["default_policy/bootstrap_obs"][2:], [[4, 4]] * 3)


def test_an_episode_cut_by_the_time_limit_is_bootstrapped_as_one_the_batch_cuts():
    rows = _two_episodes()
    rows = rows.set_column(rows.schema.get_field_index(Col.TRUNCATEDS), Col.TRUNCATEDS,
                           pa.array([False, False, False, False, True]))  # episode 8 reaches the time limit
    cut_by_the_limit, cut_by_the_batch = with_returns(rows, gamma=GAMMA), with_returns(_two_episodes(), gamma=GAMMA)
    assert sorted(cut_by_the_limit) == sorted(cut_by_the_batch)
    for name, values in cut_by_the_batch.items():
        np.testing.assert_array_equal(cut_by_the_limit[name], values, err_msg=name)


def test_n_step_transitions_stop_at_the_end_of_an_episode_or_batch():
    out = with_n_step(_two_episodes(), n=2, gamma=GAMMA)
    np.testing.assert_allclose(out["default_policy/rewards"], [1 + 0.5 * 2, 2, 4 + 0.5 * 8, 8 + 0.5 * 16, 16])
    np.testing.assert_array_equal(out[f"default_policy/{N_STEP}"], [2, 1, 2, 2, 1])
    np.testing.assert_array_equal(out["default_policy/new_obs"][:, 0], [1, 1, 3, 4, 4])
    np.testing.assert_array_equal(out["default_policy/terminateds"], [True, True, False, False, False])
    np.testing.assert_array_equal(out["default_policy/obs"], transitions(_two_episodes())["obs"])


def _streamed(algo: str, params, path) -> StreamedBatches:
    params = dataclasses.replace(params, memory_cache_mib=0)
    config = rllib_config(algo, params, path, seed=0)
    [stream] = config.offline_data_class(config).sample(num_samples=0, return_iterator=True, num_shards=0)
    return stream


def _mapped(stream) -> dict[str, np.ndarray]:
    """Every row of one pass of the stream (or held batches), as numpy columns."""
    batches = list(stream.iter_torch_batches(batch_size=1000))
    return {key: torch.cat([b[key] for b in batches]).numpy() for key in batches[0]}


def test_marwil_reads_the_discounted_returns_of_whole_episodes(mixture_dataset):
    """Streamed from the real files: every step has the return of its episode."""
    params = dataclasses.replace(load_params("params.yaml").algos.marwil, gamma=GAMMA)
    batch = _mapped(_streamed("marwil", params, mixture_dataset))

    arrays = dataset.load_arrays(mixture_dataset)
    expected = np.zeros(len(arrays[Col.REWARDS]))
    for i in reversed(range(len(expected))):
        later = i + 1 < len(expected) and arrays[Col.EPS_ID][i + 1] == arrays[Col.EPS_ID][i]
        expected[i] = arrays[Col.REWARDS][i] + GAMMA * (expected[i + 1] if later else 0.0)
    # A pass reads the row groups in a fresh order and shuffles them: match rows by their observation.
    expected_by_obs = {obs.tobytes(): value for obs, value in zip(arrays[Col.OBS], expected)}
    assert len(batch["default_policy/obs"]) == len(expected)
    assert not batch["default_policy/bootstrap_discount"].any()  # whole episodes, none cut by the time limit
    np.testing.assert_allclose(batch["default_policy/value_targets"],
                               [expected_by_obs[obs.tobytes()] for obs in batch["default_policy/obs"]], rtol=1e-6)


def test_dqn_reads_n_step_returns_from_params(mixture_dataset):
    """Streamed from the real files: CartPole pays 1 per step, so a k-step reward is sum of gamma^i."""
    params = dataclasses.replace(load_params("params.yaml").algos.dqn, n_step=3, gamma=GAMMA)
    batch = _mapped(_streamed("dqn", params, mixture_dataset))
    steps = batch[f"default_policy/{N_STEP}"]
    assert set(steps) == {1, 2, 3} and (steps == 3).mean() > 0.5
    np.testing.assert_allclose(batch["default_policy/rewards"], (1 - GAMMA**steps) / (1 - GAMMA), rtol=1e-6)
    # The last 3 steps of every terminated episode (CartPole's last at least 8) bootstrap from its end.
    assert batch["default_policy/terminateds"].sum() == 3 * dataset.load_arrays(mixture_dataset)[Col.TERMINATEDS].sum()


@pytest.mark.parametrize("cache_mib, in_memory", [(1024, True), (0, False)])
def test_small_datasets_are_held_in_memory_and_large_ones_stream(mixture_dataset, cache_mib, in_memory):
    params = load_params("params.yaml").algos.bc
    params = type(params)(**{**params.__dict__, "memory_cache_mib": cache_mib})
    config = rllib_config("bc", params, mixture_dataset, seed=0)
    data = config.offline_data_class(config)
    [iterator] = data.sample(num_samples=64, return_iterator=True, num_shards=0)
    assert isinstance(iterator, InMemoryBatches if in_memory else StreamedBatches)
    if not in_memory:
        assert iterator.read_ahead_bytes == params.stream_read_ahead_mib * 2**20
    batches = list(iterator.iter_torch_batches(batch_size=64, local_shuffle_buffer_size=1000))
    rows = dataset.read_card(mixture_dataset).transitions
    assert sum(len(batch["default_policy/obs"]) for batch in batches) == (rows // 64 * 64 if in_memory else rows)
    assert sorted(batches[0]) == sorted(cloning_batch(_rows(mixture_dataset, 0, 1)))  # BC's two columns


def test_a_streamed_pass_gives_every_row_once_shuffled_across_episodes(mixture_dataset):
    params = load_params("params.yaml").algos.bc
    params = type(params)(**{**params.__dict__, "memory_cache_mib": 0})
    config = rllib_config("bc", params, mixture_dataset, seed=0)
    [stream] = config.offline_data_class(config).sample(num_samples=0, return_iterator=True, num_shards=0)
    batches = list(stream.iter_torch_batches(batch_size=64, local_shuffle_buffer_size=500))
    assert all(len(batch["default_policy/obs"]) == 64 for batch in batches[:-1])
    seen = torch.cat([batch["default_policy/obs"] for batch in batches]).numpy()
    in_file_order = dataset.load_arrays(mixture_dataset)[Col.OBS]
    assert sorted(row.tobytes() for row in seen) == sorted(row.tobytes() for row in in_file_order)
    position = {row.tobytes(): i for i, row in enumerate(in_file_order)}
    first = [position[row.tobytes()] for row in seen[:64]]
    assert max(first) - min(first) > 4 * 64  # a batch mixes steps from far apart in the files, not one episode


def test_a_streams_buffer_keeps_its_rows_as_each_file_joins_it(tmp_path):
    """Each batch is drawn from the buffer's rows of every file read so far, not only the last: the first half of a
    pass already spans most files, as a global shuffle's would. A buffer drained whole at each fill gave them a
    few files at a time."""
    path = write_frame_stacks(tmp_path / "stacks", episodes=12)  # a file of 9 rows per episode
    stream = _streamed("bc", load_params("params.yaml").algos.bc, path)
    file_of = {}
    for number, entry in enumerate(dataset.read_card(path).files):
        rows = stream.plan.train_batch(pq.read_table(path / entry["path"]))
        for obs in batch_columns.network_observations(rows, stream.plan.model_input)["default_policy/obs"]:
            file_of[obs.tobytes()] = number
    seen = torch.cat([batch["default_policy/obs"]
                      for batch in stream.iter_torch_batches(batch_size=4, local_shuffle_buffer_size=60)]).numpy()
    assert sorted(file_of[obs.tobytes()] for obs in seen) == sorted(file_of.values())  # each row once
    assert len({file_of[obs.tobytes()] for obs in seen[:len(seen) // 2]}) >= 11


@pytest.mark.parametrize("num_shards", [2, 64])
def test_each_streamed_shard_reads_its_own_rows(mixture_dataset, num_shards):
    """Learners streaming a dataset each read a disjoint share of it: every num_shards-th run of row groups, or
    where there are fewer runs than learners (64 here), every num_shards-th row of each."""
    params = dataclasses.replace(load_params("params.yaml").algos.bc, memory_cache_mib=0)
    config = rllib_config("bc", params, mixture_dataset, seed=0)
    shards = config.offline_data_class(config).sample(num_samples=0, return_iterator=True, num_shards=num_shards)
    seen = [[row.tobytes() for row in _mapped(shard)["default_policy/obs"]] for shard in shards]
    everything = [row.tobytes() for row in dataset.load_arrays(mixture_dataset)[Col.OBS]]
    assert sorted(sum(seen, [])) == sorted(everything)  # each row once, in one shard
    assert all(seen)
    assert 2 <= len(dataset.row_group_runs(mixture_dataset)) < 64


def test_one_batch_at_a_time_where_rllib_updates_once_per_iteration(mixture_dataset):
    """With updates_per_iteration 1 and no learner actors RLlib asks for one batch per iteration, not an iterator;
    batches go on past the end of a pass."""
    params = load_params("params.yaml").algos.bc
    config = rllib_config("bc", dataclasses.replace(params, updates_per_iteration=1), mixture_dataset, seed=0)
    data = config.offline_data_class(config)
    rows = dataset.read_card(mixture_dataset).transitions
    batches = [data.sample(num_samples=256, return_iterator=False) for _ in range(rows // 256 + 2)]
    assert all(batch.env_steps() == 256 for batch in batches)
    assert sorted(batches[0]["default_policy"]) == ["actions", "obs"]


def test_a_file_unreadable_mid_stream_ends_in_one_line_naming_it(tmp_path):
    path = write_frame_stacks(tmp_path / "stacks")
    stream = _streamed("bc", load_params("params.yaml").algos.bc, path)
    name = dataset.read_card(path).files[1]["path"]
    (path / name).write_bytes(b"not parquet")
    with pytest.raises(UserError, match=f"{name} is not a readable Parquet file .*; re-collect the dataset"):
        list(stream.iter_torch_batches(batch_size=4))


def test_a_stream_the_learner_stops_reading_stops_its_reader(tmp_path):
    path = write_frame_stacks(tmp_path / "stacks", episodes=6)
    stream = _streamed("bc", load_params("params.yaml").algos.bc, path)
    batches = iter(stream.iter_torch_batches(batch_size=2))
    next(batches)
    assert any(thread.name.startswith("orl-stream") for thread in threading.enumerate())
    batches.close()
    deadline = time.monotonic() + 30
    while any(thread.name.startswith("orl-stream") for thread in threading.enumerate()):
        assert time.monotonic() < deadline, "the reader thread outlived its stream"
        time.sleep(0.05)


def test_in_memory_passes_are_fresh_permutations(mixture_dataset):
    params = load_params("params.yaml").algos.bc
    config = rllib_config("bc", params, mixture_dataset, seed=0)
    [data] = config.offline_data_class(config).sample(num_samples=0, return_iterator=True, num_shards=0)
    data.load()
    passes = [torch.cat([batch["default_policy/obs"] for batch in data.iter_torch_batches(batch_size=100)])
              for _ in range(2)]
    everything = {row.numpy().tobytes() for row in data.columns["default_policy/obs"]}
    for seen in passes:
        assert len(seen) == data.rows // 100 * 100
        assert len({row.numpy().tobytes() for row in seen}) == len(seen) and {
            row.numpy().tobytes() for row in seen} <= everything  # each row at most once per pass
    assert not torch.equal(passes[0], passes[1])
    assert len(list(data.iter_torch_batches(batch_size=10 * data.rows))) == 1  # smaller than a batch: read whole


def _rows_as_bytes(batch: dict) -> set[tuple[bytes, ...]]:
    names = sorted(batch)
    return {tuple(np.asarray(batch[name][i]).tobytes() for name in names) for i in range(len(batch[names[0]]))}


@pytest.mark.parametrize("algo", ["bc", "marwil", "dqn"])
@pytest.mark.parametrize("streamed", [False, True])
def test_frame_stacks_give_the_batches_of_the_mapped_rows(tmp_path, algo, streamed):
    """An image dataset's frames become the network's input (channels-last, in [0, 1]) batch by batch, on the
    learner's side: held in memory, its observations are ids into its frames, each frame held once; streamed, the
    frames are read as stored (uint8). Each row of a pass is a row of what mapping the Parquet rows
    gives, next observations (DQN's n-step, MARWIL's bootstrap) included."""
    path = write_frame_stacks(tmp_path / "stacks")
    params = dataclasses.replace(getattr(load_params("params.yaml").algos, algo),
                                 memory_cache_mib=0 if streamed else 256)
    config = rllib_config(algo, params, path, seed=0)
    [data] = config.offline_data_class(config).sample(num_samples=0, return_iterator=True, num_shards=0)
    as_stored = data.plan.train_batch(dataset.read_table(path))
    assert as_stored["default_policy/obs"].dtype == np.uint8
    mapped = _rows_as_bytes(batch_columns.network_observations(as_stored, data.plan.model_input))
    batches = [{name: values.numpy() for name, values in batch.items()}
               for batch in data.iter_torch_batches(batch_size=8, local_shuffle_buffer_size=16)]
    assert isinstance(data, StreamedBatches if streamed else InMemoryBatches)
    if not streamed:
        assert len(data.frames.frames) == 30  # 3 episodes of 10 distinct frames
    assert batches[0]["default_policy/obs"].shape == (8, 12, 10, 4)
    assert set().union(*map(_rows_as_bytes, batches)) <= mapped
    assert sum(len(b["default_policy/obs"]) for b in batches) == (27 if streamed else 27 // 8 * 8)


def test_each_learner_holds_its_own_share_of_the_rows(mixture_dataset):
    """With learner actors, each reads the dataset in its own process and keeps a disjoint share of the rows."""
    params = load_params("params.yaml").algos.bc
    config = rllib_config("bc", params, mixture_dataset, seed=0)
    shards = config.offline_data_class(config).sample(num_samples=0, return_iterator=True, num_shards=2)
    rows = [{row.numpy().tobytes() for row in shard.load().columns["default_policy/obs"]} for shard in shards]
    everything = [row.tobytes() for row in dataset.load_arrays(mixture_dataset)[Col.OBS]]
    assert not rows[0] & rows[1] and rows[0] | rows[1] == set(everything)
    assert abs(shards[0].rows - shards[1].rows) <= 1


@pytest.mark.slow  # two learner actors, each a process with torch
@pytest.mark.parametrize("cache_mib", [256, 0], ids=["held", "streamed"])
def test_two_learner_actors_train_in_lockstep(mixture_dataset, ray_local, cache_mib):
    """num_learners=2: each learner actor reads its share of the dataset (held or streamed), and their averaged
    gradients keep their weights equal."""
    params = dataclasses.replace(load_params("params.yaml").algos.bc, num_learners=2, updates_per_iteration=3,
                                 batch_size=64, memory_cache_mib=cache_mib)
    config = rllib_config("bc", params, mixture_dataset, seed=0)
    algorithm = config.build_algo()

    def weights():
        return [call.get() for call in algorithm.learner_group.foreach_learner(
            lambda learner: learner.module.get_state())]

    try:
        before = weights()
        results = [algorithm.train() for _ in range(2)]
        after = weights()
    finally:
        algorithm.learner_group.foreach_learner(release_data_iterator)
        algorithm.stop()
    assert np.isfinite(results[-1]["learners"]["default_policy"]["policy_loss"])
    for key, first in after[0]["default_policy"].items():
        np.testing.assert_array_equal(first, after[1]["default_policy"][key], err_msg=key)
    assert any(not np.array_equal(before[0]["default_policy"][key], value)
               for key, value in after[0]["default_policy"].items())
