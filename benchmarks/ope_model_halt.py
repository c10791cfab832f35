"""The model-based estimator with and without its halt where the ensemble's networks part (`ope.model_halt_quantile`),
on the candidates `ope_validation.py` keeps: their true scores against both estimates, per dataset; and how well its
dynamics fit, by the networks' updates.

The dynamics are fitted once per dataset and `--updates` value, as `orl ope` fits them (params.yaml's `ope` settings,
every logged episode). How well they fit: each output's squared error on the logged transitions that go on as a share of
its variance; the recall of the logged endings by the chance told from the state and the action and by the termination
network's on the state reached; and an open-loop replay of logged episodes (their own actions from their first state, in
the first network) against the logged states, and whether the replay ends where a logged episode terminates. Then each
candidate kept with a greedy true score (`truth.json`) is rolled out with the halt as fitted, without one, and with a
halt where its states leave the logged range by each of `--margins` (`ope.model_halt_margin`). Spearman,
regret@1 and MAE as `ope_validation.py` reports them (evaluation/ope_validation.py), and the share of rollouts that
halted. And for each candidate, the networks on its own episodes in the env (`--real-episodes`, states as the env
gives them, not as the model predicts): the reward of the steps that go on summed per episode, as the env gives it
and as each network predicts it; the recall of the episodes' endings; the networks' disagreement against the halt's
limit.

    python -m benchmarks.ope_model_halt --params benchmarks/suite/params.yaml \\
        --datasets-dir benchmarks/suite/datasets --references benchmarks/suite/references \\
        --datasets cartpole-random acrobot-random
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import gymnasium as gym
import numpy as np

import dataset_format as dataset
from common.envs import make_env
from common.errors import exit_on_user_error
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from evaluation import ope_validation
from evaluation.estimators import Episodes
from evaluation.model_based import DynamicsEnsemble, dynamics_updates, fit_dynamics, rollout_returns
from evaluation.ope import actor, episode_horizon, fit_progress, logged_episodes
from evaluation.references import normalized_score, read_reference
from pipelines.params import load_params

ROOT = Path(__file__).resolve().parent.parent
# Steps of the open-loop replay at which its states are compared with the logged ones.
REPLAY_STEPS = (10, 30, 100)
# The termination network calls a state an ending where it gives one better odds than this (for recall and replays).
EVEN_ODDS = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", required=True)
    parser.add_argument("--datasets-dir", type=Path, required=True)
    parser.add_argument("--references", type=Path, required=True)
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--candidates", type=Path, default=ROOT / ".cache" / "ope_candidates")
    parser.add_argument("--updates", type=int, nargs="+",
                        help="the dynamics networks' updates to fit with, one fit each, or ope.model_epochs' "
                             "passes if more (default: params.yaml's ope.model_updates)")
    parser.add_argument("--replayed", type=int, default=100, help="logged episodes replayed open loop")
    parser.add_argument("--real-episodes", type=int, default=10,
                        help="each candidate's episodes in the env the networks are checked on (0: none)")
    parser.add_argument("--margins", type=float, nargs="*", default=[],
                        help="ope.model_halt_margin values to roll out with as well, the halt as fitted beside each")
    parser.add_argument("--runs", nargs="+", default=["*"],
                        help="the kept candidates to roll out, by name or glob (bc-seed0-x0.01, 'iql-*')")
    args = parser.parse_args()

    params = load_params(args.params)
    points = []
    for name in args.datasets:
        location = dataset.locate(args.datasets_dir / name)
        card = dataset.read_card(location)
        reference = read_reference(args.references, card.env.label, params.evaluate)
        episodes = logged_episodes(location, card)
        horizon, discrete = episode_horizon(card.env, episodes), isinstance(card.spaces[1], gym.spaces.Discrete)
        for updates in args.updates or [params.ope.model_updates]:
            config = dataclasses.replace(params.ope, model_updates=updates)
            label = f"{name}, {dynamics_updates(len(episodes.arrays[Col.OBS]), config)} updates"
            model = fit_dynamics(episodes, card.spaces[1].n if discrete else None, config,
                                 fit_progress(label, "model network", "loss"))
            print_fit(label, model, episodes, args.replayed)
            # Each variant: the disagreement past which a rollout halts, and the margin past the logged range
            variants = {"halt": (model.disagreement_limit, config.model_halt_margin), "no halt": (np.inf, None),
                        **{f"halt, margin {m:g}": (model.disagreement_limit, m) for m in args.margins}}
            print(f"[{label}] halt where the networks part by more than {model.disagreement_limit:.3f}; a halt at "
                  f"step 0 counts {model.halt_value(0):.1f}, past the longest episode {model.halt_floor:.1f}",
                  flush=True)
            starts = episodes.arrays[Col.OBS][episodes.starts]
            runs = {path.parent for run in args.runs for path in (args.candidates / name).glob(f"{run}/truth.json")}
            for kept in sorted(runs):
                truth = json.loads((kept / "truth.json").read_text())["truth"]
                policy = ModulePolicy(load_rl_module(kept / "checkpoint"), card.spaces[1], greedy=True)
                line = []
                for halt, (limit, margin) in variants.items():
                    model.disagreement_limit = limit
                    model.halt_outside(margin)
                    returns, halted = rollout_returns(model, actor(policy, discrete, params.ope.seed), starts,
                                                      horizon, params.ope.gamma)
                    estimate = normalized_score(float(returns.mean()), reference)
                    estimator = f"model, {halt}" + (f", {updates} updates" if args.updates else "")
                    points.append({"dataset": name, "run": kept.name, "estimator": estimator,
                                   "estimate": estimate, "ci_low": estimate, "ci_high": estimate, "truth": truth})
                    line.append(f"{halt} {estimate:.1f} ({halted.mean():.0%} halted)")
                print(f"[{label}] {kept.name}: true {truth:.1f}; " + ", ".join(line), flush=True)
                model.disagreement_limit, margin = variants["halt"]
                model.halt_outside(margin)
                if args.real_episodes:
                    print_on_real_episodes(f"{label}, {kept.name}", model, actor(policy, discrete, params.ope.seed),
                                           card, params.evaluate.seed, args.real_episodes)
    print(ope_validation.markdown(ope_validation.validate(points)))


def print_fit(label: str, model: DynamicsEnsemble, episodes: Episodes, replayed: int) -> None:
    """How well the fitted dynamics match the logged episodes (the module's docstring says how)."""
    a = episodes.arrays
    targets = model.targets(a)[model.goes_on]
    outputs = model.outputs(a[Col.OBS][model.goes_on], a[Col.ACTIONS][model.goes_on])
    error = ((outputs - targets) ** 2).mean(axis=(0, 1))
    variance = targets.var(axis=0)
    unexplained = np.divide(error, variance, out=np.zeros_like(error), where=variance > 0)  # a constant has none
    logged_ends = ~model.goes_on
    told = {"the state and the action": model.ending(a[Col.OBS], a[Col.ACTIONS])[0] > EVEN_ODDS,
            "the state reached": model.ends(a[Col.NEW_OBS]) > EVEN_ODDS}
    print(f"[{label}] unexplained variance of each state change, then the reward, where the episode goes on: "
          + ", ".join(f"{share:.2f}" for share in unexplained)
          + f"; of the {int(logged_ends.sum())} logged endings in {len(logged_ends)} transitions, recalled from "
          + ", ".join(f"{source} {ends[logged_ends].mean():.0%} (false alarms {ends[~logged_ends].mean():.2%})"
                      for source, ends in told.items()), flush=True)
    distances, ended = open_loop_replay(model, episodes.select(np.arange(min(replayed, len(episodes)))))
    print(f"[{label}] open loop, {min(replayed, len(episodes))} logged episodes: median distance to the logged "
          "state (in the logged states' standard deviations) at step "
          + ", ".join(f"{step} {distance:.2f}" for step, distance in distances.items())
          + f"; of the {len(ended)} that terminate, {int(ended.sum())} end in the model by their logged length",
          flush=True)


def print_on_real_episodes(label: str, model: DynamicsEnsemble, act, card: dataset.DatasetCard, seed: int,
                           count: int) -> None:
    """The networks read at the states of the policy's own episodes in the env: where the model's value of a policy
    parts from its truth even with the states right. With the states right, a rollout's length is still cut by the
    chance of ending the model gives each step (as `DynamicsEnsemble.step` does, the larger of the two networks'):
    the episodes' expected lengths by those chances, against their lengths in the env."""
    env = make_env(card.env)
    steps = []  # (episode, obs, action, reward, next obs, terminated) per step
    for episode in range(count):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            action = act(np.asarray(obs, dtype=np.float32)[None])[0]
            next_obs, reward, terminated, truncated, _ = env.step(action)
            steps.append((episode, obs, action, reward, next_obs, terminated))
            obs, done = next_obs, terminated or truncated
    env.close()
    episode_of, obs, actions, rewards, next_obs, ends = (np.array(column) for column in zip(*steps))
    obs, goes_on = obs.astype(np.float32), ~ends
    outputs = model.outputs(obs[goes_on], actions[goes_on])
    predicted = np.clip(outputs[..., -1] * model.target_std[-1] + model.target_mean[-1], model.reward_low,
                        model.reward_high)  # (networks, steps that go on)
    chance_of_step, chance_of_state = model.ending(obs, actions)[0], model.ends(next_obs)
    recalled = {"the chance from the state and the action": chance_of_step[ends] > EVEN_ODDS,
                "the termination network": chance_of_state[ends] > EVEN_ODDS}
    chance = np.maximum(chance_of_step, chance_of_state)
    lengths = np.bincount(episode_of, minlength=count)
    expected = [np.cumprod(np.concatenate([[1.0], 1 - chance[episode_of == e][:-1]])).sum() for e in range(count)]
    print(f"[{label}] {count} real episodes, {len(obs)} steps: the reward of the steps that go on summed per episode, "
          f"in the env {rewards[goes_on].sum() / count:.1f}, by each network "
          + ", ".join(f"{network.sum() / count:.1f}" for network in predicted)
          + f"; {int(ends.sum())} endings, recalled by "
          + ", ".join(f"{source} {told.mean() if ends.any() else 0:.0%}" for source, told in recalled.items())
          + "; the networks' disagreement, median "
          + f"{np.median(model.disagreement(outputs)):.2f} (the halt's limit {model.disagreement_limit:.2f})",
          flush=True)
    print(f"[{label}] the chance of ending the model gives the real steps that go on: mean {chance[goes_on].mean():.4f}"
          f", median {np.median(chance[goes_on]):.4f}, 99th percentile {np.quantile(chance[goes_on], 0.99):.3f}; "
          f"the episodes' lengths in the env, mean {lengths.mean():.0f}, expected by those chances "
          f"{np.mean(expected):.0f}", flush=True)


def open_loop_replay(model: DynamicsEnsemble, episodes: Episodes) -> tuple[dict[int, float], np.ndarray]:
    """The episodes' logged actions from their first states, in the first network, all at once: the median distance
    (standardized per dimension) from the logged state at each of REPLAY_STEPS that the episodes reach, and, for each
    episode that terminates, whether the replay ended by its last step."""
    a = episodes.arrays
    logged = np.asarray(a[Col.NEW_OBS], dtype=np.float32)
    scale = logged.std(axis=0) + 1e-6
    obs = np.asarray(a[Col.OBS], dtype=np.float32)[episodes.starts]
    ended = np.zeros(len(episodes), dtype=bool)
    distances = {}
    for step in range(episodes.lengths.max()):
        alive = np.flatnonzero(episodes.lengths > step)
        rows = episodes.starts[alive] + step
        outputs = model.outputs(obs[alive], a[Col.ACTIONS][rows])
        next_obs, _, ends, _ = model.step(outputs[0], obs[alive], model.ending(obs[alive], a[Col.ACTIONS][rows]))
        ended[alive[ends > EVEN_ODDS]] = True
        obs[alive] = next_obs
        if step + 1 in REPLAY_STEPS:
            distances[step + 1] = float(np.median(np.linalg.norm((next_obs - logged[rows]) / scale, axis=1)))
    terminates = np.asarray(a[Col.TERMINATEDS], dtype=bool)[episodes.ends - 1]
    return distances, ended[terminates]


if __name__ == "__main__":
    exit_on_user_error(main)
