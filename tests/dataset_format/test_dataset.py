"""The dataset format: schema, card, validation, and the documented ways to load a dataset."""

from __future__ import annotations

import dataclasses
import json
import re

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dataset_format as dataset
from common.envs import env_spaces
from common.errors import UserError
from dataset_format import CARD_FILE, Col
from tests.conftest import copy_dataset


def test_column_names_are_rllibs():
    from ray.rllib.core.columns import Columns

    assert (Col.EPS_ID, Col.T, Col.OBS, Col.ACTIONS, Col.REWARDS, Col.NEW_OBS, Col.TERMINATEDS,
            Col.TRUNCATEDS, Col.ACTION_LOGP) == (
        Columns.EPS_ID, Columns.T, Columns.OBS, Columns.ACTIONS, Columns.REWARDS, Columns.NEXT_OBS,
        Columns.TERMINATEDS, Columns.TRUNCATEDS, Columns.ACTION_LOGP)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1", "Pendulum-v1", "LunarLander-v3"])
def test_spaces_round_trip_through_json(env_id):
    for space in env_spaces(env_id):
        encoded = json.loads(json.dumps(dataset.space_to_dict(space)))
        assert dataset.space_from_dict(encoded) == space


def test_files_are_native_arrow_columns(expert_dataset):
    card = dataset.validate(expert_dataset)
    schema = pq.read_schema(expert_dataset / card.files[0]["path"])
    assert str(schema.field(Col.OBS).type) == "fixed_size_list<element: float>[4]"
    assert str(schema.field(Col.ACTIONS).type) == "int64"
    assert [f["path"] for f in card.files] == [f"episodes-{i:05d}.parquet" for i in range(4)]
    for i, entry in enumerate(card.files):  # file i holds episodes 5i .. 5i+4, in order
        eps_id = pq.read_table(expert_dataset / entry["path"], columns=[Col.EPS_ID])[Col.EPS_ID].to_numpy()
        assert np.all(np.diff(eps_id) >= 0) and (eps_id[0], eps_id[-1]) == (5 * i, 5 * i + 4)


def test_card_describes_the_data(expert_dataset):
    card = dataset.read_card(expert_dataset)
    arrays = dataset.load_arrays(expert_dataset)
    assert card.env_id == "CartPole-v1" and card.env_spec == {"id": "CartPole-v1"}
    assert card.behavior_policy["callable"] == "examples.controllers:cartpole"
    assert card.transitions == len(arrays[Col.REWARDS]) == 10_000
    assert card.episodes == len(np.unique(arrays[Col.EPS_ID])) == 20
    assert card.returns["mean"] == 500.0 and card.episode_length["max"] == 500
    # Consecutive rows chain: new_obs of step t is obs of step t+1 within an episode.
    same_episode = arrays[Col.EPS_ID][1:] == arrays[Col.EPS_ID][:-1]
    np.testing.assert_array_equal(arrays[Col.NEW_OBS][:-1][same_episode], arrays[Col.OBS][1:][same_episode])
    assert np.all(np.diff(arrays[Col.T])[same_episode] == 1)


def test_loads_into_pandas_ray_and_torch(expert_dataset, ray_local):
    frame = dataset.load_pandas(expert_dataset)
    assert len(frame) == 10_000 and frame[Col.OBS].iloc[0].shape == (4,)

    ray_ds = dataset.load_ray(expert_dataset)
    assert ray_ds.count() == 10_000

    batches = list(dataset.torch_dataloader(expert_dataset, batch_size=4096))
    obs, actions = batches[0]
    assert obs.shape == (4096, 4) and str(obs.dtype) == "torch.float32" and str(actions.dtype) == "torch.int64"
    assert sum(len(b[1]) for b in batches) == 10_000


def test_validation_names_the_missing_directory(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        dataset.validate(tmp_path / "nope")


def test_validation_catches_a_truncated_file(expert_dataset, tmp_path):
    path = copy_dataset(expert_dataset, tmp_path / "ds")
    victim = sorted(path.glob("*.parquet"))[1]
    victim.write_bytes(victim.read_bytes()[:1000])
    with pytest.raises(UserError, match=f"{victim.name} is not a readable Parquet file"):
        dataset.validate(path)


def test_validation_catches_a_renamed_column(expert_dataset, tmp_path):
    path = copy_dataset(expert_dataset, tmp_path / "ds")
    victim = sorted(path.glob("*.parquet"))[0]
    table = pq.read_table(victim)
    pq.write_table(table.rename_columns(["reward" if n == Col.REWARDS else n for n in table.column_names]), victim)
    with pytest.raises(UserError, match="column 'rewards' is missing"):
        dataset.validate(path)


def test_validation_catches_a_card_that_disagrees(expert_dataset, tmp_path):
    path = copy_dataset(expert_dataset, tmp_path / "ds")
    card = json.loads((path / CARD_FILE).read_text())
    card["transitions"] += 1
    (path / CARD_FILE).write_text(json.dumps(card))
    with pytest.raises(UserError, match="holds 10000 transitions in 20 episodes but _card.json says 10001"):
        dataset.validate(path)


def test_validation_catches_spaces_of_another_env(expert_dataset):
    with pytest.raises(UserError, match="observation space .* does not match"):
        dataset.validate(expert_dataset, env_spaces("Acrobot-v1"))


def rewrite_file(path, index, change, row_group_size=None):
    """Applies `change` (table -> table) to the index-th Parquet file of the dataset at `path`."""
    victim = sorted(path.glob("*.parquet"))[index]
    pq.write_table(change(pq.read_table(victim)), victim, row_group_size=row_group_size)
    return victim


def replace_column(table, name, values):
    import pyarrow as pa

    return table.set_column(table.schema.get_field_index(name), table.schema.field(name),
                            pa.array(values, type=table.schema.field(name).type))


def nudge_obs(table, row):
    import pyarrow as pa

    obs = dataset.column_to_numpy(table[Col.OBS]).copy()
    obs[row] += 1.0
    field = table.schema.field(Col.OBS)
    return table.set_column(table.schema.get_field_index(Col.OBS), field,
                            pa.FixedSizeListArray.from_arrays(pa.array(obs.ravel()), obs.shape[1]))


@pytest.mark.parametrize("change,message", [
    (lambda t: t.set_column(t.schema.get_field_index(Col.REWARDS), Col.REWARDS, t[Col.REWARDS].cast("float64")),
     "column 'rewards' has type double, expected float"),
    (lambda t: replace_column(t, Col.REWARDS, np.where(np.arange(t.num_rows) == 7, np.nan, 1.0)),
     "column 'rewards' at row 7 holds NaN or inf"),
    (lambda t: replace_column(t, Col.ACTIONS, np.where(np.arange(t.num_rows) == 3, 5, 0)),
     "column 'actions' at row 3 is outside the action space Discrete(2)"),
    (lambda t: replace_column(t, Col.T, np.where(np.arange(t.num_rows) == 9, 99, t[Col.T].to_numpy())),
     "column 't' at row 9 is 99 where episode 0 is at step 9"),
    (lambda t: replace_column(t, Col.TERMINATEDS, np.arange(t.num_rows) == 4),
     "column 'terminateds' at row 4 ends its episode early"),
    (lambda t: t.take(np.r_[np.arange(500, 1000), np.arange(0, 500), np.arange(1000, t.num_rows)]),
     "column 'eps_id' at row 500 breaks the order"),
    (lambda t: nudge_obs(t, 7), "column 'obs' at row 7 is not the previous step's new_obs"),
    (lambda t: replace_column(t, Col.TRUNCATEDS, np.zeros(t.num_rows, dtype=bool)),
     "column 'terminateds' at row 499 ends its episode without terminateds or truncateds"),
])
@pytest.mark.parametrize("row_group_size", [None, 7])  # 7: every check also runs across row groups
def test_validation_names_the_bad_value(expert_dataset, tmp_path, change, message, row_group_size):
    path = copy_dataset(expert_dataset, tmp_path / "ds")
    victim = rewrite_file(path, 0, change, row_group_size)
    with pytest.raises(UserError, match=f"{victim.name}: {message}".replace("(", r"\(").replace(")", r"\)")):
        dataset.validate(path)


def test_validation_refuses_an_empty_dataset(expert_dataset, tmp_path):
    path = copy_dataset(expert_dataset, tmp_path / "ds")
    card = json.loads((path / CARD_FILE).read_text())
    for file in path.glob("*.parquet"):
        file.unlink()
    (path / CARD_FILE).write_text(json.dumps({**card, "files": [], "transitions": 0, "episodes": 0}))
    with pytest.raises(UserError, match="is empty"):
        dataset.validate(path)


def test_validation_reads_row_groups_one_at_a_time_across_episodes(expert_dataset, tmp_path):
    path = copy_dataset(expert_dataset, tmp_path / "ds")
    for index in range(len(dataset.read_card(path).files)):
        rewrite_file(path, index, lambda table: table, row_group_size=7)  # episodes span many groups
    assert dataset.validate(path) == dataset.read_card(expert_dataset)
    assert dataset.load_table(path).equals(dataset.load_table(expert_dataset))


def test_write_keeps_the_row_order_of_large_blocks(expert_dataset, tmp_path):
    """pyarrow's threaded dataset writer, under Ray's write_parquet, interleaved blocks of over 2**18 rows."""
    import ray

    episodes, steps = 1080, 500  # two blocks of 270,000 rows
    rng = np.random.default_rng(0)
    trajectories = rng.standard_normal((episodes, steps + 1, 4)).astype(np.float32)  # observations
    columns = {Col.EPS_ID: np.repeat(np.arange(episodes), steps), Col.T: np.tile(np.arange(steps), episodes),
               Col.OBS: trajectories[:, :-1].reshape(-1, 4), Col.NEW_OBS: trajectories[:, 1:].reshape(-1, 4),
               Col.ACTIONS: rng.integers(0, 2, episodes * steps), Col.REWARDS: np.ones(episodes * steps),
               Col.TERMINATEDS: np.tile(np.arange(steps) == steps - 1, episodes),
               Col.TRUNCATEDS: np.zeros(episodes * steps, dtype=bool), Col.ACTION_LOGP: np.zeros(episodes * steps)}
    card = dataset.read_card(expert_dataset)
    table = dataset.transitions_table(columns, card.schema())
    blocks = ray.data.from_arrow([table.slice(0, table.num_rows // 2), table.slice(table.num_rows // 2)])
    written = dataset.write(blocks, tmp_path / "large", dataclasses.replace(card, episodes=episodes), file_bytes=2**30)
    assert [f["rows"] for f in written.files] == [table.num_rows]
    assert dataset.load_table(tmp_path / "large").equals(table)


def test_observations_are_stored_at_their_dtype():
    discrete = dataset.arrow_schema(gym.spaces.Discrete(16), gym.spaces.Discrete(4), with_logp=False)
    assert discrete.field(Col.OBS).type == pa.int64() and discrete.field(Col.NEW_OBS).type == pa.int64()
    frames = dataset.arrow_schema(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6), False)
    # The stack's 4 frames, each a value of a dictionary: a group of rows holds a frame once.
    assert frames.field(Col.OBS).type == pa.list_(pa.dictionary(pa.int32(), pa.binary()), 4)
    single = dataset.arrow_schema(gym.spaces.Box(0, 255, (210, 160, 3), np.uint8), gym.spaces.Discrete(6), False)
    assert single.field(Col.OBS).type.list_size == 1  # channels last: the whole image, one value
    floats = dataset.arrow_schema(gym.spaces.Box(-1.0, 1.0, (17,), np.float64), gym.spaces.Discrete(2), False)
    assert floats.field(Col.OBS).type == pa.list_(pa.float32(), 17)  # float32, as learners read


@pytest.mark.parametrize("observation_space,action_space,message", [
    (gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), gym.spaces.Discrete(2), "observation space Dict("),
    (gym.spaces.Discrete(3, start=1), gym.spaces.Discrete(2), "observation space Discrete(3, start=1)"),
    (gym.spaces.Box(-1, 1, (2,)), gym.spaces.MultiDiscrete([2, 3]), "action space MultiDiscrete([2 3])"),
])
def test_spaces_a_dataset_cannot_hold_are_refused_in_one_line(observation_space, action_space, message):
    with pytest.raises(UserError, match=re.escape(f"env X: {message}")) as err:
        dataset.require_storable(observation_space, action_space, "env X")
    assert "\n" not in str(err.value)
