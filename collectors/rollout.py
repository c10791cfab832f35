"""Stepping environments under a policy: the loop, and the Ray actor that runs it.

Episode `i` of a run with seed `s` resets its environment and seeds its policy randomness from
`SeedSequence([s, i])`, so every episode is reproducible on its own, whichever actor runs it.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pyarrow as pa
import ray

from collectors.config import PolicyConfig
from collectors.dataset import Col, arrow_schema, episode_stats, transitions_table
from collectors.envs import make_env
from collectors.policies import RandomPolicy, build_policy, knows_logp, worker_env_vars


def episode_seeds(seed: int, eps_id: int) -> tuple[int, np.random.Generator]:
    """(env reset seed, policy generator) of one episode."""
    env_seq, policy_seq = np.random.SeedSequence([seed, eps_id]).spawn(2)
    return int(env_seq.generate_state(1)[0]), np.random.default_rng(policy_seq)


class _Episode:
    """Per-step buffers of one running episode."""

    def __init__(self, eps_id: int):
        self.eps_id = eps_id
        self.steps: dict[str, list] = {c: [] for c in (Col.OBS, Col.ACTIONS, Col.REWARDS, Col.NEW_OBS,
                                                       Col.TERMINATEDS, Col.TRUNCATEDS, Col.ACTION_LOGP)}

    def columns(self) -> dict[str, np.ndarray]:
        n = len(self.steps[Col.REWARDS])
        cols = {name: np.asarray(values) for name, values in self.steps.items() if values}
        cols[Col.EPS_ID] = np.full(n, self.eps_id, dtype=np.int64)
        cols[Col.T] = np.arange(n, dtype=np.int32)
        return cols


def run_episodes(env_id: str, policy_config: PolicyConfig, seed: int, eps_ids: list[int], num_envs: int) -> pa.Table:
    """Runs the given episodes to their end on `num_envs` environments stepped in lockstep.

    Returns one Arrow table in the dataset schema, rows ordered by (eps_id, t).
    """
    envs = [make_env(env_id) for _ in range(min(num_envs, len(eps_ids)))]
    action_space = envs[0].action_space
    with_logp = knows_logp(policy_config, action_space)
    schema = arrow_schema(envs[0].observation_space, action_space, with_logp)
    policy = build_policy(policy_config, env_id, action_space)
    mix = policy_config.random_episodes
    random_policy = RandomPolicy(action_space)
    pending = iter(eps_ids)
    slots: list[tuple[_Episode, np.random.Generator, np.ndarray] | None] = [None] * len(envs)
    by_random = [False] * len(envs)
    finished: list[_Episode] = []

    def start(slot: int) -> None:
        eps_id = next(pending, None)
        if eps_id is None:
            slots[slot] = None
            return
        env_seed, rng = episode_seeds(seed, eps_id)
        obs, _ = envs[slot].reset(seed=env_seed)
        # Drawn only for mixed data, so other datasets' random streams (and bytes) stay as they were.
        by_random[slot] = mix > 0 and rng.random() < mix
        slots[slot] = (_Episode(eps_id), rng, obs)

    for slot in range(len(envs)):
        start(slot)
    while any(slots):
        active = [i for i, s in enumerate(slots) if s is not None]
        obs = np.stack([slots[i][2] for i in active])
        actions, logp = _act(policy, random_policy, [by_random[i] for i in active], obs,
                             [slots[i][1] for i in active], [envs[i] for i in active], with_logp)
        for row, i in enumerate(active):
            episode, rng, _ = slots[i]
            new_obs, reward, terminated, truncated, _ = envs[i].step(actions[row])
            steps = episode.steps
            steps[Col.OBS].append(obs[row])
            steps[Col.ACTIONS].append(actions[row])
            steps[Col.REWARDS].append(reward)
            steps[Col.NEW_OBS].append(new_obs)
            steps[Col.TERMINATEDS].append(terminated)
            steps[Col.TRUNCATEDS].append(truncated)
            if logp is not None:
                steps[Col.ACTION_LOGP].append(logp[row])
            if terminated or truncated:
                finished.append(episode)
                start(i)
            else:
                slots[i] = (episode, rng, new_obs)
    for env in envs:
        env.close()
    finished.sort(key=lambda e: e.eps_id)
    per_episode = [e.columns() for e in finished]
    columns = {f.name: np.concatenate([cols[f.name] for cols in per_episode]) for f in schema}
    return transitions_table(columns, schema)


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


# Tests only: when set to a file path that does not exist yet, the first collector to finish a shard creates
# the file and dies before returning, as a crashed machine would.
CRASH_ONCE_ENV = "ORL_TEST_CRASH_COLLECTOR_ONCE"


# A collector that dies is restarted and its unfinished shard re-run; episodes are seeded by index, so the
# redone shard is identical.
@ray.remote(num_cpus=1, max_restarts=3, max_task_retries=3)
class Collector:
    """One Ray actor stepping `num_envs` copies of an environment under one behaviour policy."""

    def __init__(self, env_id: str, policy_config: PolicyConfig, seed: int, num_envs: int):
        self.args = (env_id, policy_config, seed)
        self.num_envs = num_envs

    @ray.method(num_returns=2)
    def run(self, eps_ids: list[int]) -> tuple[pa.Table, tuple[np.ndarray, np.ndarray]]:
        """The episodes' transitions as one table, and their (returns, lengths): small, for the driver."""
        table = run_episodes(*self.args, eps_ids, self.num_envs)
        crash_marker = os.environ.get(CRASH_ONCE_ENV)
        if crash_marker and not os.path.exists(crash_marker):
            open(crash_marker, "w").close()
            os._exit(1)
        return table, episode_stats(table)


def run_on_actors(env_id: str, policy_config: PolicyConfig, seed: int, shards: list[list[int]],
                  num_actors: int, num_envs: int, label: str):
    """Runs each shard of episode ids on a pool of Collector actors, showing progress on stderr.

    Returns (table refs in shard order, per-episode returns and lengths in eps_id order).
    """
    options = {"runtime_env": {"env_vars": env_vars}} if (env_vars := worker_env_vars(policy_config)) else {}
    actors = [Collector.options(**options).remote(env_id, policy_config, seed, num_envs)
              for _ in range(min(num_actors, len(shards)))]
    calls = [actors[i % len(actors)].run.remote(shard) for i, shard in enumerate(shards)]
    table_refs = [table for table, _ in calls]
    stats_refs = [stats for _, stats in calls]
    started, episodes, steps, total = time.monotonic(), 0, 0, sum(len(s) for s in shards)
    remaining = list(stats_refs)
    while remaining:
        ready, remaining = ray.wait(remaining, num_returns=1)
        _, lengths = ray.get(ready[0])
        episodes, steps = episodes + len(lengths), steps + int(lengths.sum())
        elapsed = time.monotonic() - started
        print(f"[{label}] {episodes}/{total} episodes, {steps} steps, {elapsed:.1f}s ({steps / elapsed:,.0f} steps/s)",
              file=sys.stderr, flush=True)
    stats = ray.get(stats_refs)
    for actor in actors:
        ray.kill(actor)
    return table_refs, np.concatenate([r for r, _ in stats]), np.concatenate([n for _, n in stats])


def rollout_returns(env_id: str, policy_config: PolicyConfig, seed: int, episodes: int, num_workers: int,
                    label: str) -> np.ndarray:
    """Returns of `episodes` seeded episodes of a policy, run in parallel Ray actors (for evaluation)."""
    per_worker = -(-episodes // num_workers)
    shards = [list(range(s, min(s + per_worker, episodes))) for s in range(0, episodes, per_worker)]
    _, returns, _ = run_on_actors(env_id, policy_config, seed, shards, num_workers, num_envs=per_worker, label=label)
    return returns
