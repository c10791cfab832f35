"""Where FQE's value goes wrong: its V(s_t) along a policy's own episodes in the env, against the returns those
episodes got from t on, and how far each state lies from the data FQE was fitted on.

FQE is fitted as `orl ope` fits it (params.yaml's `ope` settings, every logged episode) for each candidate of
`ope_validation.py`'s cache; the candidate then plays `--episodes` greedy episodes. Printed per candidate, by stretches
of the episodes' steps: FQE's mean value there, the mean return-to-go actually got, their gap, and the mean distance
from each state to its nearest logged state (observations standardized by the data's spread), against the same
distance for logged states held out of the search (the data's own spacing).

    python -m benchmarks.fqe_along_rollouts --params benchmarks/suite/params.yaml \\
        --dataset benchmarks/suite/datasets/lunarlander-mixed --candidates .cache/ope_candidates/lunarlander-mixed
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import dataset_format as dataset
from common.envs import make_env
from common.errors import exit_on_user_error
from common.observations import ModelInput
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from evaluation.estimators import fit_fqe
from evaluation.ope import episode_horizon, fit_progress, logged_episodes
from pipelines.params import load_params

STRETCHES = 5  # stretches of the horizon, each summarized on its own


def rollouts(policy: ModulePolicy, card: dataset.DatasetCard, episodes: int, seed: int):
    """(observations, steps, rewards) of each greedy episode, from seeds `seed`, `seed` + 1, ..."""
    env = make_env(card.env)
    played = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        observations, rewards, done = [], [], False
        while not done:
            observations.append(obs)
            action = policy.probabilities(obs[None])[0].argmax()
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(reward)
            done = terminated or truncated
        played.append((np.array(observations), np.arange(len(rewards)), np.array(rewards)))
    env.close()
    return played


def nearest_distances(queries: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Each query's Euclidean distance to its nearest row of `data`."""
    queries, data = torch.as_tensor(queries, dtype=torch.float32), torch.as_tensor(data, dtype=torch.float32)
    return torch.cat([torch.cdist(chunk, data).min(dim=1).values for chunk in queries.split(1024)]).numpy()


class StateDistances:
    """Distances between observations standardized by the logged ones' spread, in units of a logged state's mean
    distance to its nearest other logged state (the data's spacing, measured on 2,000 of them held out)."""

    def __init__(self, logged: np.ndarray):
        self.mean, self.spread = logged.mean(axis=0), logged.std(axis=0) + 1e-8
        self.logged = self.standardized(logged)
        held = np.random.default_rng(0).permutation(len(self.logged))
        self.spacing = float(nearest_distances(self.logged[held[-2000:]], self.logged[held[:-2000]]).mean())

    def standardized(self, obs: np.ndarray) -> np.ndarray:
        return (obs - self.mean) / self.spread

    def to_nearest(self, obs: np.ndarray, among: np.ndarray | None = None) -> np.ndarray:
        """Each observation's distance to its nearest logged state (of the rows `among` only, if given)."""
        data = self.logged if among is None else self.logged[among]
        return nearest_distances(self.standardized(obs), data) / self.spacing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--candidates", type=Path, required=True,
                        help="a dataset's folder of ope_validation.py's cache")
    parser.add_argument("--runs", nargs="+", help="the candidates' folder names (default: all)")
    parser.add_argument("--episodes", type=int, default=5)
    args = parser.parse_args()
    params = load_params(args.params)
    location = dataset.locate(args.dataset)
    card = dataset.read_card(location)
    if not isinstance(card.spaces[1], gym.spaces.Discrete) or len(card.spaces[0].shape) != 1:
        raise SystemExit(f"{card.name}: this check takes vector observations and Discrete actions")
    episodes = logged_episodes(location, card)
    a = episodes.arrays
    horizon = episode_horizon(card.env, episodes)
    states = StateDistances(a[Col.OBS])
    print(f"{card.name}: {len(episodes)} episodes, {len(a[Col.OBS]):,} states; a logged state's mean distance to its "
          f"nearest other logged state: {states.spacing:.3f}")
    edges = np.linspace(0, horizon, STRETCHES + 1).astype(int)
    for folder in sorted(args.candidates.iterdir()):
        if args.runs and folder.name not in args.runs or not (folder / "checkpoint").is_dir():
            continue
        policy = ModulePolicy(load_rl_module(folder / "checkpoint"), card.spaces[1], True, None)
        q = fit_fqe(episodes, policy.probabilities(a[Col.NEW_OBS]), card.spaces[1].n, horizon, params.ope,
                    fit_progress(folder.name), ModelInput.of(card.spaces[0]))
        played = rollouts(policy, card, args.episodes, params.evaluate.seed)
        obs = np.concatenate([o for o, _, _ in played])
        t = np.concatenate([steps for _, steps, _ in played])
        to_go = np.concatenate([np.cumsum(r[::-1])[::-1] for _, _, r in played])
        value = q.values(obs, t, policy.probabilities(obs)).mean(axis=1)
        distance = states.to_nearest(obs)
        lengths = [len(r) for _, _, r in played]
        print(f"\n{folder.name}: episodes of {min(lengths)}-{max(lengths)} steps, return {np.mean(to_go[t == 0]):.1f}, "
              f"FQE at t 0: {np.mean(value[t == 0]):.1f}")
        print("| steps | states | FQE V(s_t) | return-to-go got | FQE - got | distance to the data (x spacing) |")
        print("|---|---|---|---|---|---|")
        for low, high in zip(edges[:-1], edges[1:]):
            rows = (t >= low) & (t < high)
            if rows.any():
                print(f"| {low}-{high} | {rows.sum()} | {value[rows].mean():.1f} | {to_go[rows].mean():.1f} | "
                      f"{(value[rows] - to_go[rows]).mean():+.1f} | {distance[rows].mean():.1f} |")
        error = value - to_go
        print(f"correlation of FQE's error with the distance: {np.corrcoef(error, distance)[0, 1]:+.2f}")


if __name__ == "__main__":
    exit_on_user_error(main)
