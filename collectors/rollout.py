"""Stepping environments under a policy: the loop, and the Ray Data map that runs it on collector actors.

Episode `i` of a run with seed `s` resets its environment and seeds its policy randomness from
`SeedSequence([s, i])`, so every episode is reproducible on its own, whichever actor runs it.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import pyarrow as pa
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from collectors.config import PolicyConfig
from collectors.policies import Policy, RandomPolicy, build_policy, worker_env_vars
from common.envs import EnvSpec, make_env, step_actions
from common.trained_policy import is_mlflow_uri
from dataset_format import (Col, FrameColumn, FrameNumbering, arrow_schema, episode_stats, flat_dim, is_frames_type,
                            require_storable, transitions_table)


def episode_seeds(seed: int, eps_id: int) -> tuple[int, np.random.Generator]:
    """(env reset seed, policy generator) of one episode."""
    env_seq, policy_seq = np.random.SeedSequence([seed, eps_id]).spawn(2)
    return int(env_seq.generate_state(1)[0]), np.random.default_rng(policy_seq)


TASK_EPISODES = "eps_ids"  # the one column of the task list that `episodes_dataset` maps over


class EpisodeRunner:
    """Runs episodes under one behaviour policy on `num_envs` environments stepped in lockstep.

    Ray Data keeps one per collector actor and calls it with each task, so the environments and the policy
    (a model, for neural ones) are built once per actor, not once per task. `policy`, when given, is the one
    `policy_config` describes, already built (`orl train-online` scores the module it is training).
    `observations=False` leaves the observations out of its tables, for returns alone: an evaluator of long image
    episodes would otherwise hold every frame of them, gigabytes it never reads.
    """

    def __init__(self, env: EnvSpec, policy_config: PolicyConfig, seed: int, num_envs: int, progress=None,
                 policy: Policy | None = None, observations: bool = True):
        self.envs = [make_env(env) for _ in range(num_envs)]
        action_space = self.envs[0].action_space
        self.policy = policy or build_policy(policy_config, self.envs[0])
        self.with_logp = self.policy.with_logp
        self.schema = arrow_schema(self.envs[0].observation_space, action_space, self.with_logp)
        self.observations = observations
        if not observations:
            self.schema = pa.schema([f for f in self.schema if f.name not in (Col.OBS, Col.NEW_OBS)])
        obs_type = self.schema.field(Col.OBS).type if observations else None
        # Images stored as frames are recorded as frames: each distinct one once a task, not 8 times a transition.
        self.frame_count = obs_type.list_size if observations and is_frames_type(obs_type) else 0
        self.random_policy = RandomPolicy(action_space)
        self.random_episodes = policy_config.random_episodes
        self.seed = seed
        self.progress = progress  # a Progress actor, told of each finished task

    def __call__(self, task: pa.Table) -> pa.Table:
        eps_ids = task[TASK_EPISODES][0].as_py()
        table = self.run(eps_ids)
        if self.progress is not None:
            # Each task runs its episodes to the end.
            self.progress.add.remote(eps_ids[0], len(eps_ids), table.num_rows, ray.get_runtime_context().get_node_id())
        return table

    def run(self, eps_ids: list[int]) -> pa.Table:
        """Runs the given episodes to their end; returns one table in the dataset schema, ordered by (eps_id, t)."""
        envs = self.envs[:len(eps_ids)]
        pending = iter(eps_ids)
        # One entry per step, in the order stepped: each env steps its episode in order, so a stable sort by
        # eps_id at the end puts every episode's steps together without per-episode buffers.
        steps: dict[str, list] = {c: [] for c in (Col.EPS_ID, Col.OBS, Col.ACTIONS, Col.REWARDS, Col.NEW_OBS,
                                                  Col.TERMINATEDS, Col.TRUNCATEDS, Col.ACTION_LOGP)}
        eps_of, rng_of, obs_of = [0] * len(envs), [None] * len(envs), [None] * len(envs)
        by_random = [False] * len(envs)
        frames, frame_ids_of = FrameNumbering(), [None] * len(envs)

        def frame_ids(observation: np.ndarray) -> np.ndarray:
            return frames.ids(observation.reshape(1, self.frame_count, -1))[0]

        def start(slot: int) -> bool:
            """Starts the next pending episode on `slot`'s env; False when none is left."""
            eps_id = next(pending, None)
            if eps_id is None:
                return False
            env_seed, rng_of[slot] = episode_seeds(self.seed, eps_id)
            obs_of[slot], _ = envs[slot].reset(seed=env_seed)
            if self.frame_count:
                frame_ids_of[slot] = frame_ids(obs_of[slot])
            eps_of[slot] = eps_id
            # Drawn only for mixed data, so other datasets' random streams (and bytes) stay as they were.
            by_random[slot] = self.random_episodes > 0 and rng_of[slot].random() < self.random_episodes
            return True

        active = [slot for slot in range(len(envs)) if start(slot)]
        while active:
            obs = np.stack([obs_of[i] for i in active])
            actions, logp = _act(self.policy, self.random_policy, [by_random[i] for i in active], obs,
                                 [rng_of[i] for i in active], [envs[i] for i in active], self.with_logp)
            still_running = []
            env_actions = step_actions(actions, envs[0].action_space)
            for row, i in enumerate(active):
                new_obs, reward, terminated, truncated, _ = envs[i].step(env_actions[row])
                steps[Col.EPS_ID].append(eps_of[i])
                if self.frame_count:
                    steps[Col.OBS].append(frame_ids_of[i])
                    frame_ids_of[i] = frame_ids(new_obs)
                    steps[Col.NEW_OBS].append(frame_ids_of[i])
                elif self.observations:
                    steps[Col.OBS].append(obs[row])
                    steps[Col.NEW_OBS].append(new_obs)
                steps[Col.ACTIONS].append(actions[row])
                steps[Col.REWARDS].append(reward)
                steps[Col.TERMINATEDS].append(terminated)
                steps[Col.TRUNCATEDS].append(truncated)
                if logp is not None:
                    steps[Col.ACTION_LOGP].append(logp[row])
                obs_of[i] = new_obs
                if not (terminated or truncated) or start(i):
                    still_running.append(i)
            active = still_running
        eps_id = np.asarray(steps.pop(Col.EPS_ID), dtype=np.int64)
        order = np.argsort(eps_id, kind="stable")
        columns = {name: _in_order(values, order) for name, values in steps.items() if values}
        if self.frame_count:
            frame_bytes = flat_dim(envs[0].observation_space) // self.frame_count
            distinct = frames.array((frame_bytes,), np.uint8)
            for name in (Col.OBS, Col.NEW_OBS):
                columns[name] = FrameColumn(distinct, columns[name])
        columns[Col.EPS_ID] = eps_id[order]
        _, first_row, length = np.unique(columns[Col.EPS_ID], return_index=True, return_counts=True)
        columns[Col.T] = np.arange(len(order), dtype=np.int32) - np.repeat(first_row, length).astype(np.int32)
        return transitions_table(columns, self.schema)


def _in_order(values: list, order: np.ndarray) -> np.ndarray:
    """A column of per-step values, its rows in `order`. Arrays (observations, Box actions) are stacked in that order,
    one copy of each: a stacked array of frames indexed by `order` copied them all again, far slower than a copy
    (benchmarks/throughput.md, "Frames in order")."""
    if isinstance(values[0], np.ndarray) and values[0].ndim:
        return np.stack([values[i] for i in order])
    return np.asarray(values)[order]


def _act(policy, random_policy, by_random: list[bool], obs, rngs, envs, with_logp: bool):
    """Actions (and log-probs) for a batch whose rows belong to `policy`, or to `random_policy` where flagged.

    Each policy sees only its own rows, so an episode's random stream does not depend on its batch-mates.
    """
    if not any(by_random):
        return policy.act(obs, rngs, envs)
    actions, logp = [None] * len(obs), np.zeros(len(obs), dtype=np.float32)
    for acting, flag in ((random_policy, True), (policy, False)):
        rows = [row for row, r in enumerate(by_random) if r == flag]
        if rows:
            own_actions, own_logp = acting.act(obs[rows], [rngs[i] for i in rows], [envs[i] for i in rows])
            for k, row in enumerate(rows):
                actions[row] = own_actions[k]
            if with_logp:
                logp[rows] = own_logp
    return np.array(actions), (logp if with_logp else None)


@ray.remote(num_cpus=0)
class Progress:
    """Counts the episodes and steps that collectors have finished, for the driver's progress line, and the
    episodes each Ray node ran (where the work went on a cluster). A task run again (its node lost, its actor
    restarted) counts once, on the node that ran it last."""

    def __init__(self):
        self.tasks: dict[int, tuple[int, int, str]] = {}  # first episode -> episodes, steps, node

    def add(self, first_episode: int, episodes: int, steps: int, node_id: str) -> None:
        self.tasks[first_episode] = (episodes, steps, node_id)

    def totals(self) -> tuple[int, int]:
        return sum(t[0] for t in self.tasks.values()), sum(t[1] for t in self.tasks.values())

    def nodes(self) -> dict[str, int]:
        by_node: dict[str, int] = {}
        for episodes, _, node_id in self.tasks.values():
            by_node[node_id] = by_node.get(node_id, 0) + episodes
        return by_node


def episodes_dataset(env: EnvSpec, policy_config: PolicyConfig, seed: int, tasks: list[list[int]],
                     num_collectors: int, num_envs: int, progress, label: str,
                     observations: bool = True) -> ray.data.Dataset:
    """A lazy Ray Dataset of the transitions of every task's episodes, in task order, run by a pool of
    `num_collectors` actors (1 CPU each), with the observations unless `observations` is False (`EpisodeRunner`). A
    collector that dies is restarted and its task re-run; episodes are seeded by index, so the redone task is
    identical. Consuming it streams: memory holds a few tasks, not all.

    The actors are named after `label` (`MapWorker(MapBatches(collect cartpole-random))` in Ray's dashboard and
    `ray list actors`), so a person watching a cluster tells a dataset's collectors from a run's evaluators."""
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    if policy_config.model and not is_mlflow_uri(policy_config.model):
        # Actors run in their own working directories (on a cluster, on other machines of a shared file system).
        policy_config = dataclasses.replace(policy_config, model=str(Path(policy_config.model).resolve()))
    env_vars = worker_env_vars(policy_config)
    # Up to 8 tasks queued per actor (Ray Data's default is 2) keep actors busy while the driver, sharing the
    # cores with them, is slow to hand out the next task.
    # At most a quarter of an actor's share, though: the first actor to start would take a short task list.
    pool_size = min(num_collectors, len(tasks))
    queued = max(1, min(8, len(tasks) // (4 * pool_size)))
    collectors = ray.data.ActorPoolStrategy(size=pool_size, max_tasks_in_flight_per_actor=queued)
    # Each task's episodes stay one block, which files are cut between, so that every file holds whole episodes.
    # Ray Data slices a block of over 1.5x target_max_block_size (128 MiB): a task of four Pong episodes, 56 KiB
    # of frames per transition, came out as two blocks, the first ending mid-episode. The dataset seals the
    # setting as it is made.
    context = ray.data.DataContext.get_current()
    block_size, context.target_max_block_size = context.target_max_block_size, None
    try:
        return ray.data.from_items([{TASK_EPISODES: task} for task in tasks],
                                   override_num_blocks=len(tasks)).map_batches(
            type(label, (EpisodeRunner,), {}), fn_constructor_args=(env, policy_config, seed, num_envs, progress),
            fn_constructor_kwargs={"observations": observations},
            batch_size=1,
            batch_format="pyarrow", compute=collectors, num_cpus=1,
            **({"runtime_env": {"env_vars": env_vars}} if env_vars else {}))
    finally:
        context.target_max_block_size = block_size


@contextmanager
def progress_lines(label: str, total_episodes: int, every_s: float = 2.0):
    """Yields a Progress actor for `episodes_dataset`; meanwhile prints its totals on stderr whenever they change,
    and at the end, on a cluster, the nodes that ran the episodes. It returns once the collector actors' CPUs are
    free again (`wait_for_free_cpus`).

    The actor lives on the driver's node: a lost worker node must not take the count with it."""
    free_cpus = ray.available_resources().get("CPU", 0.0)
    on_driver_node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    progress = Progress.options(scheduling_strategy=on_driver_node).remote()
    started, done = time.monotonic(), threading.Event()

    def report(last: tuple[int, int] | None) -> tuple[int, int]:
        totals = ray.get(progress.totals.remote())
        if totals != last:
            _print_progress(label, *totals, total_episodes, started)
        return totals

    def loop() -> None:
        last = (0, 0)
        while not done.wait(every_s):
            last = report(last)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield progress
        report(None)  # the final totals
        _print_nodes(label, episodes_by_node(progress))
    finally:
        done.set()
        thread.join()
        ray.kill(progress)
    wait_for_free_cpus(free_cpus)


def _print_progress(label: str, episodes_done: int, steps: int, total_episodes: int, started: float) -> None:
    elapsed = time.monotonic() - started
    print(f"[{label}] {episodes_done}/{total_episodes} episodes, {steps} steps, {elapsed:.1f}s "
          f"({steps / elapsed:,.0f} steps/s)", file=sys.stderr, flush=True)


def wait_for_free_cpus(cpus: float, timeout_s: float = 30.0) -> None:
    """Waits until `cpus` CPUs are free in Ray again, or `timeout_s` passed (another job may hold them). Ray Data
    lets go of an actor pool's CPUs after its dataset is consumed, not before: a pool started meanwhile (evaluation
    right after collection, the expert's references after the random policy's) would find none free, and Ray Data
    warns that its job will hang."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0.0) < cpus and time.monotonic() < deadline:
        time.sleep(0.05)


def episodes_by_node(progress) -> dict[str, int]:
    """How many episodes each Ray node ran, by node id, from a `progress_lines` actor."""
    return ray.get(progress.nodes.remote())


def _print_nodes(label: str, nodes: dict[str, int]) -> None:
    """On a cluster, a line naming the nodes that ran episodes (their ids' first 8 characters). Printed, not kept in
    a dataset's card: its bytes must not depend on the cluster."""
    if len(nodes) > 1:
        shares = ", ".join(f"{node[:8]} {episodes}" for node, episodes in sorted(nodes.items()))
        print(f"[{label}] episodes by Ray node: {shares}", file=sys.stderr, flush=True)


TASKS_PER_WORKER = 4


class Rollouts(NamedTuple):
    returns: np.ndarray
    """One return per episode, in episode order."""
    episodes_by_node: dict[str, int]
    """How many episodes each Ray node ran, by node id."""


def check_env(env: EnvSpec) -> tuple[gym.Space, gym.Space]:
    """The env's spaces, from making it once in this process: a bad spec, an env this process cannot import or
    spaces no dataset holds fail here, in one line, not in `rollout_returns`' actors (call it first)."""
    made = make_env(env)
    made.close()
    require_storable(made.observation_space, made.action_space, f"env {EnvSpec.of(env).label}")
    return made.observation_space, made.action_space


def rollout_returns(env: EnvSpec, policy_config: PolicyConfig, seed: int, episodes: int, num_workers: int,
                    label: str) -> Rollouts:
    """Returns of `episodes` seeded episodes of a policy (for evaluation), run in parallel by `num_workers` Ray
    actors, or with 0 in this process, without Ray (quicker for a few episodes: no actor loads the policy).

    Each actor gets several tasks, so that one slow to start (loading a model on a busy node) still takes a share."""
    per_task = -(-episodes // (max(num_workers, 1) * TASKS_PER_WORKER))
    tasks = [list(range(s, min(s + per_task, episodes))) for s in range(0, episodes, per_task)]
    if num_workers == 0:
        return _rollout_in_process(env, policy_config, seed, tasks, episodes, per_task, label)
    with progress_lines(label, episodes) as progress:
        stats = episodes_dataset(env, policy_config, seed, tasks, num_workers, per_task, progress, label,
                                 observations=False).select_columns([Col.EPS_ID, Col.REWARDS]).to_arrow_refs()
        returns, _ = episode_stats(pa.concat_tables(ray.get(stats)))
        nodes = episodes_by_node(progress)
    return Rollouts(returns, nodes)


def _rollout_in_process(env: EnvSpec, policy_config: PolicyConfig, seed: int, tasks: list[list[int]], episodes: int,
                        num_envs: int, label: str) -> Rollouts:
    runner, started = EpisodeRunner(env, policy_config, seed, num_envs, observations=False), time.monotonic()
    tables, steps = [], 0
    for task in tasks:
        tables.append(runner.run(task).select([Col.EPS_ID, Col.REWARDS]))
        steps += tables[-1].num_rows
        _print_progress(label, task[-1] + 1, steps, episodes, started)
    returns, _ = episode_stats(pa.concat_tables(tables))
    return Rollouts(returns, {})
