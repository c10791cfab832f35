"""FQE on policies whose true value is known without training anything: a dataset's own behaviour policy and the
controller it mixes with random actions. Where FQE values them right but over-values learned candidates
(`ope_validation.py`), its error comes from the candidates, not from the fit.

The dataset's behaviour must be a `mixture` of epsilon-random actions over a deterministic `callable` base, on
Discrete actions, possibly with `random_episodes` (whose logged action probabilities are all 1/n); FQE runs with
params.yaml's `ope` settings, as `orl ope` does.

    python -m benchmarks.ope_known_policies --params benchmarks/suite/params.yaml \\
        --dataset benchmarks/suite/datasets/lunarlander-mixed --references benchmarks/suite/references
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import dataset_format as dataset
from collectors.config import PolicyConfig
from collectors.policies import build_policy
from common.envs import make_env
from common.errors import UserError, exit_on_user_error
from common.observations import ModelInput
from dataset_format import Col
from evaluation.estimators import fit_fqe
from evaluation.ope import episode_horizon, fit_progress, logged_episodes
from evaluation.references import normalized_score, read_reference
from pipelines.params import load_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--references", required=True)
    args = parser.parse_args()
    params = load_params(args.params)
    location = dataset.locate(args.dataset)
    card = dataset.read_card(location)
    behaviour = card.behavior_policy
    if behaviour.get("kind") != "mixture" or behaviour["base"].get("kind") != "callable":
        raise UserError(f"{card.name}'s behaviour is {behaviour}; this check needs a mixture over a callable")
    episodes = logged_episodes(location, card)
    a = episodes.arrays
    n, epsilon = card.spaces[1].n, behaviour["epsilon"]
    controller = build_policy(PolicyConfig(kind="callable", callable=behaviour["base"]["callable"]),
                              make_env(card.env))
    # The random episodes are those whose every logged action had probability 1/n.
    random_episode = np.array([np.allclose(a[Col.ACTION_LOGP][s:e], -np.log(n))
                               for s, e in zip(episodes.starts, episodes.ends)])[episodes.episode_of_rows, None]

    def controller_probabilities(obs: np.ndarray) -> np.ndarray:
        return np.eye(n)[controller.act(obs, rngs=None, envs=None)[0]]

    def behaviour_probabilities(obs: np.ndarray) -> np.ndarray:
        return np.where(random_episode, 1 / n, epsilon / n + (1 - epsilon) * controller_probabilities(obs))

    reference = read_reference(args.references, card.env.label, params.evaluate)
    ceiling = params.references.get(card.env.label)
    controller_is_ceiling = ceiling is not None and ceiling.ceiling is not None and \
        ceiling.ceiling.callable == behaviour["base"]["callable"]  # its true score is 100 by definition
    horizon = episode_horizon(card.env, episodes)
    for name, probabilities, truth in (
            ("behaviour policy", behaviour_probabilities,
             normalized_score(float(episodes.returns_to_go(1.0)[episodes.starts].mean()), reference)),
            (f"controller {behaviour['base']['callable']}", controller_probabilities,
             100.0 if controller_is_ceiling else None)):
        q = fit_fqe(episodes, probabilities(a[Col.NEW_OBS]), n, horizon, params.ope, fit_progress(name),
                    ModelInput.of(card.spaces[0]))
        value = q.values(a[Col.OBS], a[Col.T], probabilities(a[Col.OBS]))[episodes.starts].mean()
        known = "unknown (it is not the env's ceiling reference)" if truth is None else f"{truth:.1f}"
        print(f"{card.name}: {name}: FQE {normalized_score(float(value), reference):.1f}, true {known}",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    exit_on_user_error(main)
