"""Minari datasets (Farama's successor of D4RL) in and out.

Minari keeps each episode's N+1 observations (the last one included) against N actions, rewards, terminations
and truncations: observations[:-1] are our `obs`, observations[1:] our `new_obs`. Minari is an optional extra
(`pip install ".[minari]"`), imported only here.
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np

import dataset_format as dataset
from common.envs import EnvSpec, env_spaces, make_env
from common.errors import UserError, first_line
from dataset_format import Col, episode_bounds
from interop.config import ImportConfig
from interop.source import Source

# What the card keeps of a Minari dataset's metadata.
METADATA_KEYS = ("dataset_id", "minari_version", "algorithm_name", "author", "code_permalink", "description",
                 "ref_min_score", "ref_max_score")


def _minari():
    try:
        import minari
    except ImportError:
        raise UserError("Minari is not installed; install the extra: pip install -e '.[minari]'") from None
    return minari


def read_minari(config: ImportConfig) -> Source:
    """The episodes of the Minari dataset `config.source` names (a directory, or an id in the local store)."""
    data = _open(config.source)
    observation_space, action_space = data.observation_space, data.action_space
    for what, space in (("observation", observation_space), ("action", action_space)):
        if not (isinstance(space, gym.spaces.Box) or (isinstance(space, gym.spaces.Discrete) and space.start == 0)):
            _refuse_space(config.source, what, space)
    env_spec_id = data.env_spec.id if data.env_spec is not None else None
    if config.env:
        if env_spec_id not in (None, config.env.id or config.env.label):
            raise UserError(f"{config.source}: the Minari dataset was collected on {env_spec_id}, not "
                            f"{config.env.label}; name the right env, or leave env empty for data without a simulator")
        _require_env_spaces(config, observation_space, action_space)
    if not config.env and env_spec_id in gym.registry:
        print(f"[import] {config.source} was collected on {env_spec_id}: set its `env: {env_spec_id}` in params.yaml "
              "to evaluate the policies trained on it", file=sys.stderr)
    metadata = data.storage.metadata
    kept = {key: _json_ready(metadata[key]) for key in METADATA_KEYS if metadata.get(key) is not None}
    return Source(observation_space, action_space, _episodes(data, config.source, observation_space, action_space),
                  episode_count=data.total_episodes, with_logp=False,
                  metadata={"minari": {**kept, "env_spec": env_spec_id}},
                  behavior=str(metadata.get("algorithm_name", "")))


def _open(source: str):
    minari = _minari()
    path = Path(source).expanduser()
    try:
        if path.exists():
            data_dir = path if path.name == "data" else path / "data"
            if not data_dir.is_dir():
                raise UserError(f"{source} is not a Minari dataset (it has no data/ directory); name the dataset's "
                                "directory or its id in the local Minari store")
            return minari.MinariDataset(str(data_dir))
        return minari.load_dataset(source)
    except FileNotFoundError:
        raise UserError(f"no Minari dataset at {source}: it is neither a directory nor an id in the local Minari "
                        f"store ({minari.storage.get_dataset_path()}); `minari download` it or fix the path") from None
    except (OSError, ValueError, KeyError) as err:
        raise UserError(f"{source} is not a readable Minari dataset ({first_line(err)})") from None


def _require_env_spaces(config: ImportConfig, observation_space: gym.Space, action_space: gym.Space) -> None:
    for what, ours, theirs in zip(("observation", "action"), (observation_space, action_space), env_spaces(config.env)):
        if dataset.space_to_dict(ours) != dataset.space_to_dict(theirs):
            raise UserError(f"{config.source}: the data's {what} space {ours} is not {config.env.label}'s {theirs}; "
                            "name the right env, or leave env empty for data without a simulator")


def _gymnasium_spec(env: EnvSpec | None) -> gym.envs.registration.EnvSpec | None:
    if env is None:
        return None
    made = make_env(env)
    try:
        return made.spec
    finally:
        made.close()


def _refuse_space(source: str, what: str, space: gym.Space) -> None:
    raise UserError(f"{source}: the Minari dataset's {what} space {space} cannot be represented: our datasets hold "
                    "Box or Discrete (from 0) observations and actions")


def _json_ready(value):
    return sorted(value) if isinstance(value, (set, frozenset)) else value


def _episodes(data, source: str, observation_space: gym.Space, action_space: gym.Space):
    discrete = isinstance(action_space, gym.spaces.Discrete)
    # Rows as the writer stores them: a Discrete observation's integer, or a Box's values in a row (at its dtype).
    row = (-1,) if isinstance(observation_space, gym.spaces.Box) else ()
    for episode in data.iterate_episodes():
        steps = len(episode.rewards)
        observations = np.asarray(episode.observations).reshape(steps + 1, *row)
        terminations = np.asarray(episode.terminations, dtype=bool)
        truncations = np.asarray(episode.truncations, dtype=bool)
        done = terminations | truncations
        if steps == 0 or not done[-1] or done[:-1].any():
            raise UserError(f"{source}: Minari episode {episode.id} does not end exactly at its last step "
                            f"({steps} steps, terminations or truncations at {np.flatnonzero(done).tolist()}); "
                            "only whole episodes can be imported")
        actions = np.asarray(episode.actions)
        yield {
            Col.OBS: observations[:-1],
            Col.ACTIONS: actions.astype(np.int64) if discrete else actions.astype(np.float32).reshape(steps, -1),
            Col.REWARDS: np.asarray(episode.rewards, dtype=np.float32),
            Col.NEW_OBS: observations[1:],
            Col.TERMINATEDS: terminations,
            Col.TRUNCATEDS: truncations,
        }


def export_minari(path: str, dataset_id: str) -> Path:
    """Writes the dataset at `path` to the local Minari store as `dataset_id`; returns its directory. The Minari
    dataset names our env, as gymnasium's spec of the made env with its wrappers (so `recover_environment`
    works), when the card has one."""
    minari = _minari()
    from minari.data_collector import EpisodeBuffer

    card = dataset.read_card(path)
    target = minari.storage.get_dataset_path(dataset_id)
    if target.exists():
        raise UserError(f"a Minari dataset {dataset_id} already exists at {target}; choose another id or version")
    observation_space, action_space = card.spaces
    arrays = dataset.load_arrays(path)  # validated as it is read
    starts, ends = episode_bounds(arrays[Col.EPS_ID])

    def buffers():
        for index, (start, end) in enumerate(zip(starts, ends)):
            rows = slice(start, end)
            observations = np.concatenate([arrays[Col.OBS][rows], arrays[Col.NEW_OBS][end - 1:end]])
            actions = arrays[Col.ACTIONS][rows]
            yield EpisodeBuffer(
                id=index,
                observations=observations.reshape(-1, *observation_space.shape).astype(observation_space.dtype),
                actions=actions if card.action_space["type"] == "Discrete"
                else actions.reshape(-1, *action_space.shape).astype(action_space.dtype),
                rewards=arrays[Col.REWARDS][rows].tolist(),
                terminations=arrays[Col.TERMINATEDS][rows].tolist(),
                truncations=arrays[Col.TRUNCATEDS][rows].tolist(),
            )

    try:
        with warnings.catch_warnings():  # Minari's advice to name an author, an e-mail and so on
            warnings.simplefilter("ignore", UserWarning)
            minari.create_dataset_from_buffers(
                dataset_id, buffers(), env=_gymnasium_spec(card.env), observation_space=observation_space,
                action_space=action_space, algorithm_name=json.dumps(card.behavior_policy, sort_keys=True),
                description=f"{card.name}, exported from {path} by offline-rl-pipeline ({card.code_version})",
            )
    except BaseException as err:
        shutil.rmtree(target, ignore_errors=True)  # no half-written dataset in the store
        if isinstance(err, ValueError):  # Minari's word on a bad id
            raise UserError(f"cannot export to Minari as {dataset_id}: {first_line(err)}") from None
        raise
    print(f"[export {card.name}] wrote Minari dataset {dataset_id} ({card.episodes} episodes, {card.transitions} "
          f"steps) to {target}", file=sys.stderr)
    return target
