"""Property: validation accepts a dataset whose content is intact, or rejects it with a UserError. Never a crash,
never corrupt data passed on."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dataset_format as dataset
from collectors.collect import collect
from collectors.config import CollectConfig, DatasetConfig, PolicyConfig
from common.errors import UserError


@pytest.fixture(scope="module")
def small_dataset(ray_local, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("props") / "cartpole-random"
    spec = DatasetConfig(env="CartPole-v1", episodes=6, seed=5, policy=PolicyConfig(kind="random"))
    collect("cartpole-random", spec, CollectConfig(num_collectors=1, episodes_per_task=3, file_mib=0.001), path)
    return path


def drop(table, column, rng):
    return table.drop_columns([column])


def rename(table, column, rng):
    return table.rename_columns([f"{n}_x" if n == column else n for n in table.column_names])


def retype(table, column, rng):
    """Tensors become variable-size lists of float64; scalars become strings."""
    field = table.schema.field(column)
    target = pa.list_(pa.float64()) if pa.types.is_fixed_size_list(field.type) else pa.string()
    return table.set_column(table.schema.get_field_index(column), column, table[column].cast(target))


def shuffle(table, column, rng):
    return table.take(rng.permutation(table.num_rows))


def inject_nan(table, column, rng):
    if column not in (dataset.Col.OBS, dataset.Col.NEW_OBS, dataset.Col.REWARDS):
        return table
    values = dataset.column_to_numpy(table[column]).astype(np.float32).copy()
    values.reshape(len(values), -1)[rng.integers(len(values)), 0] = np.nan
    return dataset.transitions_table({**{n: dataset.column_to_numpy(table[n]) for n in table.column_names},
                                      column: values}, table.schema)


def reorder_columns(table, column, rng):
    return table.select(list(rng.permutation(table.column_names)))


def keep_prefix(table, column, rng):
    return table.slice(0, int(rng.integers(table.num_rows)))


def identity(table, column, rng):
    return table


TABLE_MUTATIONS = [drop, rename, retype, shuffle, inject_nan, reorder_columns, keep_prefix, identity]
COLUMNS = ["eps_id", "t", "obs", "actions", "rewards", "new_obs", "terminateds", "truncateds", "action_logp"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=st.sampled_from(TABLE_MUTATIONS + ["truncate"]), column=st.sampled_from(COLUMNS),
       file_index=st.integers(0, 1), seed=st.integers(0, 2**16))
def test_validation_accepts_intact_data_or_rejects_clearly(small_dataset, mutation, column, file_index, seed):
    rng = np.random.default_rng(seed)
    original = dataset.load_arrays(small_dataset)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(shutil.copytree(small_dataset, Path(scratch) / "ds"))
        victim = sorted(path.glob("*.parquet"))[file_index]
        if mutation == "truncate":
            data = victim.read_bytes()
            victim.write_bytes(data[: int(rng.integers(len(data)))])
        else:
            pq.write_table(mutation(pq.read_table(victim), column, rng), victim)
        try:
            dataset.validate(path)
        except UserError as err:
            assert "\n" not in str(err)
            return
        accepted = dataset.load_arrays(path)  # accepted: the content must be exactly the original
        assert accepted.keys() == original.keys()
        for name in original:
            np.testing.assert_array_equal(accepted[name], original[name])
