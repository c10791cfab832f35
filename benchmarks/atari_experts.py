"""The Atari suite's hand-written experts (`examples.controllers:pong`, `:breakout`) at each dead band, and their
epsilon-mixtures: mean score and transitions per episode, on the env spec and policy of one of the suite's expert
datasets (benchmarks/atari/params.yaml), sticky actions included.

    python -m benchmarks.atari_experts --dataset pong-expert --dead-bands 4 5 6 7 8 --episodes 6
    python -m benchmarks.atari_experts --dataset breakout-expert --epsilons 0.1 0.2 0.3 --episodes 8 --seed 100

Episode i is seeded as `orl collect` seeds it (`collectors.rollout.episode_seeds`), from --seed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import examples.controllers
from common.errors import exit_on_user_error
from collectors.config import PolicyConfig
from collectors.rollout import EpisodeRunner
from dataset_format import episode_stats
from pipelines.params import load_params

SUITE = Path(__file__).parent / "atari" / "params.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="pong-expert", help="an expert dataset of the suite: its env and policy")
    parser.add_argument("--dead-bands", type=float, nargs="+", help="default: the controller's own")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.0])
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    params = load_params(SUITE)
    env, expert = params.dataset(args.dataset).env, params.dataset(args.dataset).policy
    # The controller reads its dead band from examples/controllers.py at each step: `pong` reads _PONG_DEAD_BAND.
    dead_band = f"_{expert.callable.split(':')[1].upper()}_DEAD_BAND"
    print("| dead band | epsilon | episodes | score (mean ± std) | transitions an episode | s |")
    print("|---|---|---|---|---|---|")
    for band in args.dead_bands or [getattr(examples.controllers, dead_band)]:
        setattr(examples.controllers, dead_band, band)
        for epsilon in args.epsilons:
            policy = PolicyConfig(kind="mixture", epsilon=epsilon, base=expert) if epsilon else expert
            started = time.monotonic()
            runner = EpisodeRunner(env, policy, args.seed, num_envs=1, observations=False)
            returns, lengths = episode_stats(runner.run(list(range(args.episodes))))
            print(f"| {band:g} | {epsilon:g} | {args.episodes} | {returns.mean():.1f} ± {returns.std():.1f} | "
                  f"{lengths.mean():,.0f} | {time.monotonic() - started:.0f} |", flush=True)


if __name__ == "__main__":
    exit_on_user_error(main)
