"""Collection throughput: steps/s of `orl collect` ÷ (collectors × a plain gymnasium loop), measured in one run.

The plain loop is the ceiling per core: one process, one environment, `env.step(policy(obs))` and nothing
else (no recording, no Parquet). The collector loop alone is what each collector actor runs
(collectors/rollout.py: `envs_per_collector` environments in lockstep, every step recorded, one Arrow table),
in this process, without Ray. The plain loops run in parallel, one process per collector, show what this
machine's cores give together. `orl collect` is timed end to end on a running Ray: actors started, every
episode stepped, recorded, written to Parquet through Ray Data and validated. Behaviour policies: random,
the env's heuristic expert (its ceiling in --params' `references`, else in the full suite's: a controller of
examples/controllers.py), and a neural one (an RLlib MLP module, 2 x 256, sampling its actions).

    python benchmarks/collection_throughput.py --envs CartPole-v1 LunarLander-v3 --steps 200000

`--envs` also takes the name of a dataset in --params, for its env spec with wrappers (Atari's preprocessing and
frame stack); the collect settings are --params' too (a few episodes per task for Atari: each is about 50 MiB).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

from collectors.collect import collect
from collectors.config import CollectConfig, DatasetConfig, PolicyConfig
from collectors.policies import build_policy
from collectors.rollout import EpisodeRunner, episode_seeds
from common.envs import EnvSpec, env_spaces, make_env, step_actions
from common.errors import UserError, exit_on_user_error
from common.ray_runtime import start_ray
from pipelines.params import Params, load_params

ROOT = Path(__file__).resolve().parent.parent
SUITE_PARAMS = ROOT / "benchmarks" / "suite" / "params.yaml"  # the full suite's: a ceiling for each of its envs
POLICIES = ("random", "expert", "neural")

# Typical episode lengths under each policy, to ask `orl collect` for about --steps steps.
EPISODE_STEPS = {("CartPole-v1", "random"): 22, ("CartPole-v1", "expert"): 500, ("CartPole-v1", "neural"): 22,
                 ("LunarLander-v3", "random"): 95, ("LunarLander-v3", "expert"): 260,
                 ("LunarLander-v3", "neural"): 95, ("ALE/Pong-v5", "random"): 940}


def episodes_for(env: EnvSpec, kind: str, steps: int) -> int:
    return max(8, steps // EPISODE_STEPS[(env.label, kind)])


def expert_policy(env: EnvSpec, params: Params) -> PolicyConfig:
    """The env's expert: the ceiling of its normalized score in `params`' references, or in the full suite's."""
    for source in (params, load_params(SUITE_PARAMS)):
        reference = source.references.get(env.label)
        if reference is not None and reference.ceiling is not None:
            return reference.ceiling
    raise UserError(f"{env.label} has no expert: give it references.{env.label}.ceiling in --params")


def neural_policy_dir(env: EnvSpec, out: Path) -> Path:
    """An untrained RLlib MLP module for the env, saved as `orl collect` loads trained ones."""
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    observation_space, action_space = env_spaces(env)
    config = BCConfig().environment(observation_space=observation_space, action_space=action_space).rl_module(
        model_config=DefaultModelConfig(fcnet_hiddens=[256, 256]))
    module = config.get_rl_module_spec().build()
    module.save_to_path(out / env.label)
    return out / env.label


def plain_loop(env_spec: EnvSpec, policy_config: PolicyConfig, steps: int) -> float:
    """Steps/s of one environment stepped under the policy, one observation at a time, on one core."""
    import torch

    # One thread, as in a Ray worker with 1 CPU: several loops with a thread per core each would thrash.
    torch.set_num_threads(1)
    env = make_env(env_spec)
    policy = build_policy(policy_config, env)
    episode, rng = 0, None
    obs, done = None, True
    started = time.perf_counter()
    for _ in range(steps):
        if done:
            env_seed, rng = episode_seeds(0, episode)
            obs, _ = env.reset(seed=env_seed)
            episode += 1
        actions, _ = policy.act(obs[None], [rng], [env])
        # Actions stepped as the collectors step them.
        obs, _, terminated, truncated, _ = env.step(step_actions(actions, env.action_space)[0])
        done = terminated or truncated
    return steps / (time.perf_counter() - started)


def collector_loop(env: EnvSpec, policy_config: PolicyConfig, episodes: int, num_envs: int) -> float:
    """Steps/s of one collector's loop, tables included, in this process (one thread, as in plain_loop)."""
    runner = EpisodeRunner(env, policy_config, 0, num_envs)
    started = time.perf_counter()
    table = runner.run(list(range(episodes)))
    return table.num_rows / (time.perf_counter() - started)


def parallel_plain_loops(env: EnvSpec, policy_config: PolicyConfig, steps: int, processes: int) -> float:
    """Total steps/s of `processes` plain loops running at once (each timed from its own first step)."""
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return sum(pool.starmap(plain_loop, [(env, policy_config, steps)] * processes))


def orl_collect(env: EnvSpec, policy_config: PolicyConfig, episodes: int, settings: CollectConfig) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        card = collect("bench", DatasetConfig(env=env, episodes=episodes, seed=0, policy=policy_config),
                       settings, Path(tmp) / "bench")
        return card.transitions / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "LunarLander-v3"],
                        help="registered ids, or names of --params' datasets, whose env spec (wrappers included) is "
                             "taken: a Pong dataset's for Atari frames")
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--steps", type=int, default=200_000, help="about this many steps per measurement")
    parser.add_argument("--collectors", type=int, nargs="+", default=None,
                        help="collector counts to compare (default: params.yaml's collect.num_collectors)")
    args = parser.parse_args()

    params = load_params(args.params)
    start_ray(params.ray.num_cpus)
    counts = args.collectors or [params.collect.num_collectors]
    rows = ["| env | policy | collectors | plain loop steps/s | collector loop alone (÷ plain) | plain loops in parallel "
            "| orl collect steps/s | ratio (÷ collectors × plain) | ÷ plain loops in parallel |",
            "|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as modules:
        envs = [params.datasets[name].env if name in params.datasets else EnvSpec.of(name) for name in args.envs]
        for env in envs:
            for kind in args.policies:
                if kind == "neural":
                    policy = PolicyConfig(kind="model", model=str(neural_policy_dir(env, Path(modules))))
                elif kind == "expert":
                    policy = expert_policy(env, params)
                else:
                    policy = PolicyConfig(kind="random")
                single_core_steps = min(args.steps, 50_000)
                plain = plain_loop(env, policy, single_core_steps)
                alone = collector_loop(env, policy, episodes_for(env, kind, single_core_steps),
                                       params.collect.envs_per_collector)
                for count in counts:
                    settings = dataclasses.replace(params.collect, num_collectors=count)
                    parallel = parallel_plain_loops(env, policy, args.steps // count, count)
                    rate = orl_collect(env, policy, episodes_for(env, kind, args.steps), settings)
                    rows.append(f"| {env.label} | {kind} | {count} | {plain:,.0f} | "
                                f"{alone:,.0f} ({alone / plain:.2f}) | {parallel:,.0f} | {rate:,.0f} | "
                                f"{rate / (count * plain):.2f} | {rate / parallel:.2f} |")
                    print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    exit_on_user_error(main)
