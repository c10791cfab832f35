"""How far the data is from the actions a policy takes where FQE backs up its values, against FQE's error.

FQE reads V(s') = sum_a pi(a|s') Q(s', a) only at logged next states s'. With one transition per continuous state,
Q(s', a) rests on the logged states near s' where the data took a. For each candidate of an `ope_validation.py`
result (its cached checkpoint), this measures, at every logged s', the distance from s' to the nearest logged state
where the data took the policy's action (weighted by pi; observations standardized by the data's spread, in units of
a logged state's mean distance to its nearest other logged state), and sets it beside FQE's error in that result.
The dataset's controller, where its behaviour is a mixture over one, is measured too.

    python -m benchmarks.ope_action_support --dataset benchmarks/suite/datasets/lunarlander-mixed \\
        --results benchmarks/results/ope-lunarlander-mixed/ope_validation.json \\
        --candidates .cache/ope_candidates/lunarlander-mixed
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import dataset_format as dataset
from benchmarks.fqe_along_rollouts import StateDistances
from benchmarks.ope_validation import kept_candidate
from collectors.config import PolicyConfig
from collectors.policies import build_policy
from common.envs import make_env
from common.errors import exit_on_user_error
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from evaluation.ope import logged_episodes
from evaluation.ope_validation import spearman


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--results", type=Path, required=True, help="ope_validation.json of a run on the dataset")
    parser.add_argument("--candidates", type=Path, required=True, help="the dataset's folder of the candidates' cache")
    args = parser.parse_args()
    location = dataset.locate(args.dataset)
    card = dataset.read_card(location)
    a = logged_episodes(location, card).arrays
    states = StateDistances(a[Col.OBS])
    # (next states, actions): the distance from s' to the nearest logged state where the data took each action.
    support = np.stack([states.to_nearest(a[Col.NEW_OBS], among=a[Col.ACTIONS] == action)
                        for action in range(card.spaces[1].n)], axis=1)
    print("| policy | true score | FQE | FQE's error | support distance: mean | median |\n|---|---|---|---|---|---|")
    behaviour = card.behavior_policy
    if behaviour.get("kind") == "mixture" and behaviour["base"].get("kind") == "callable":
        controller = build_policy(PolicyConfig(kind="callable", callable=behaviour["base"]["callable"]),
                                  make_env(card.env))
        taken = support[np.arange(len(support)), controller.act(a[Col.NEW_OBS], rngs=None, envs=None)[0]]
        print(f"| the controller | | | | {taken.mean():.2f} | {np.median(taken):.2f} |")
    errors, means = [], []
    for candidate in json.loads(args.results.read_text())["candidates"]:
        folder = kept_candidate(args.candidates, candidate["algo"], candidate["seed"], candidate["budget"])
        policy = ModulePolicy(load_rl_module(folder / "checkpoint"), card.spaces[1], True, None)
        with torch.no_grad():
            pi = np.concatenate([policy.probabilities(rows) for rows in np.array_split(a[Col.NEW_OBS], 20)])
        distance = (pi * support).sum(axis=1)
        errors.append(candidate["fqe"] - candidate["truth"])
        means.append(distance.mean())
        print(f"| {folder.name} | {candidate['truth']:.1f} | {candidate['fqe']:.1f} | {errors[-1]:+.1f} | "
              f"{means[-1]:.2f} | {np.median(distance):.2f} |")
    print(f"\nSpearman of FQE's error with the mean support distance: {spearman(errors, means):+.2f}")


if __name__ == "__main__":
    exit_on_user_error(main)
