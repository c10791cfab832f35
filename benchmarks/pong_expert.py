"""The Pong expert (`examples.controllers:pong`) at each dead band, and its epsilon-mixtures: mean score and
transitions per episode, on the Atari suite's env spec (benchmarks/atari/params.yaml), sticky actions included.

    python -m benchmarks.pong_expert --dead-bands 4 5 6 7 8 --epsilons 0 --episodes 6
    python -m benchmarks.pong_expert --dead-bands 6 --epsilons 0.1 0.15 0.25 0.5 --episodes 3 --seed 100

Episode i is seeded as `orl collect` seeds it (`collectors.rollout.episode_seeds`), from --seed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import examples.controllers
from collectors.config import PolicyConfig
from collectors.rollout import EpisodeRunner
from dataset_format import episode_stats
from pipelines.params import load_params

SUITE = Path(__file__).parent / "atari" / "params.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dead-bands", type=float, nargs="+", default=[examples.controllers._PONG_DEAD_BAND])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.0])
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    params = load_params(SUITE)
    env, expert = params.dataset("pong-expert").env, params.dataset("pong-expert").policy
    print("| dead band | epsilon | episodes | score (mean ± std) | transitions an episode | s |")
    print("|---|---|---|---|---|---|")
    for band in args.dead_bands:
        examples.controllers._PONG_DEAD_BAND = band  # the sweep: the controller reads it at each step
        for epsilon in args.epsilons:
            policy = PolicyConfig(kind="mixture", epsilon=epsilon, base=expert) if epsilon else expert
            started = time.monotonic()
            runner = EpisodeRunner(env, policy, args.seed, num_envs=1, observations=False)
            returns, lengths = episode_stats(runner.run(list(range(args.episodes))))
            print(f"| {band:g} | {epsilon:g} | {args.episodes} | {returns.mean():.1f} ± {returns.std():.1f} | "
                  f"{lengths.mean():,.0f} | {time.monotonic() - started:.0f} |", flush=True)


if __name__ == "__main__":
    main()
