"""D4RL's "medium-replay" for the pipeline's online policies: every episode PPO sampled while it trained, written by
`orl train-online` as a dataset of ours (`datasets/NAME-replay`).

RLlib's env runners hand each `sample()`'s episodes, finished or cut where the iteration ended, to an
`on_sample_end` callback (`record_samples`), which keeps their steps in the env runner's process; after each
iteration the trainer takes them (`take_recorded`, through RLlib's public `foreach_env_runner`), and at the end
`write_replay` joins each episode's pieces in the order the episodes began. Episodes still running when training
stopped are left out. The replay is held in memory until it is written: meant for vector observations.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

import dataset_format as dataset
from common.envs import EnvSpec

# The code a replay's bytes depend on, as a collected dataset's card records it.
REPLAY_CODE = ("common", "dataset_format", "training")
# Where an env runner's env that maps observations for the network (training/online.py's `rllib_env`) keeps the
# env's own observation, in each step's info: the replay stores what the env returned, as collection does.
RAW_OBSERVATION = "orl_raw_observation"

_recorded: list[dict[str, np.ndarray]] = []  # in each env runner's process: its pieces not yet taken


def record_samples(*, samples, **_) -> None:
    """RLlib's `on_sample_end` callback: keeps the steps of each episode piece `sample()` returns."""
    for piece in samples:
        steps = len(piece)
        if not steps:
            continue
        infos = piece.get_infos(slice(0, steps + 1))
        if RAW_OBSERVATION in infos[0]:
            observations = np.stack([info[RAW_OBSERVATION] for info in infos])
        else:
            observations = np.asarray(piece.get_observations(slice(0, steps + 1)))
        last = np.arange(steps) == steps - 1
        _recorded.append({
            "episode": np.full(steps, piece.id_),
            dataset.Col.T: piece.t_started + np.arange(steps, dtype=np.int32),
            dataset.Col.OBS: observations[:-1],
            dataset.Col.ACTIONS: np.asarray(piece.get_actions(slice(0, steps))),
            dataset.Col.REWARDS: np.asarray(piece.get_rewards(slice(0, steps)), dtype=np.float32),
            dataset.Col.NEW_OBS: observations[1:],
            dataset.Col.TERMINATEDS: last & piece.is_terminated,
            dataset.Col.TRUNCATEDS: last & piece.is_truncated,
        })


def take_recorded(_env_runner=None) -> list[dict[str, np.ndarray]]:
    """Hands over (and forgets) this process's recorded pieces; run on each env runner by the trainer."""
    taken = list(_recorded)
    _recorded.clear()
    return taken


def write_replay(pieces: list[dict[str, np.ndarray]], name: str, env: EnvSpec, spaces: tuple[gym.Space, gym.Space],
                 providers: dict[str, str], behaviour: str, out: str | Path, file_bytes: int) -> dataset.DatasetCard:
    """Writes the episodes the pieces complete to `out`, a dataset named `name`, in the order they began; `spaces`
    and `providers` (common.envs.provider_versions) are the env's."""
    columns = {key: np.concatenate([piece[key] for piece in pieces]) for key in pieces[0]}
    episodes = columns.pop("episode")
    order = {episode: index for index, episode in enumerate(dict.fromkeys(episodes))}  # as they began
    columns[dataset.Col.EPS_ID] = np.fromiter((order[e] for e in episodes), np.int64, len(episodes))
    rows = np.lexsort((columns[dataset.Col.T], columns[dataset.Col.EPS_ID]))  # each episode's steps in order
    ended = columns[dataset.Col.TERMINATEDS] | columns[dataset.Col.TRUNCATEDS]
    rows = rows[np.isin(columns[dataset.Col.EPS_ID][rows], columns[dataset.Col.EPS_ID][ended])]
    columns = {key: values[rows] for key, values in columns.items()}
    columns[dataset.Col.ACTIONS] = _as_executed(columns[dataset.Col.ACTIONS], spaces[1])
    bounds = [*np.flatnonzero(np.diff(columns[dataset.Col.EPS_ID], prepend=-1)), len(rows)]
    columns[dataset.Col.EPS_ID] = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))  # 0, 1, ... again
    card = dataset.DatasetCard.new(name, env, spaces, {"kind": "logged", "description": behaviour}, None,
                                   len(bounds) - 1, False, REPLAY_CODE, providers)
    tables = (dataset.transitions_table({key: values[begin:end] for key, values in columns.items()}, card.schema())
              for begin, end in zip(bounds[:-1], bounds[1:]))  # one an episode: files are cut between them
    return dataset.write_tables(tables, out, card, file_bytes)


def _as_executed(actions: np.ndarray, space: gym.Space) -> np.ndarray:
    """The actions the env executed: RLlib 2.60 (`normalize_actions`, its default) samples a bounded Box's actions
    around [-1, 1] and hands the env this rescaling of them to the bounds, clipped."""
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    return unsquash_action(actions, space) if isinstance(space, gym.spaces.Box) else actions
