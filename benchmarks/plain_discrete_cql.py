"""Diagnostic: d3rlpy's DiscreteCQL recipe as a plain torch loop, on a dataset's columns as our DQN reads them.

One Q head (no dueling), double Q, Huber TD loss, alpha * (logsumexp Q - Q(data action)), a hard target sync every
`--target-update-every` updates, Adam without gradient clipping, batches drawn uniformly with replacement. It
separates what the algorithm does on some data from what RLlib or d3rlpy add: benchmarks/README.md's parity notes
compare its scores with conservative DQN's and DiscreteCQL's. Evaluated greedily on the pipeline's evaluation seeds,
normalized with the references the quality table uses.

    python benchmarks/plain_discrete_cql.py --dataset acrobot-medium --updates 10000 --seeds 0 1 2 3 4 5
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from ray.rllib.core import DEFAULT_MODULE_ID
from torch import nn

import dataset_format as dataset
from collectors.rollout import episode_seeds
from common.envs import EnvSpec, make_env
from common.errors import exit_on_user_error
from evaluation.references import CEILING, no_score_reason, normalized_score, read_reference
from pipelines.params import load_params
from training.algorithms.batch_columns import ACTIONS, NEXT_OBS, OBS, REWARDS, TERMINATEDS, with_n_step

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "benchmarks" / "suite"  # the full suite's pipeline: its params, datasets and references


def train(columns: dict[str, torch.Tensor], actions: int, args, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    layers, width = [], columns[OBS].shape[1]
    for hidden in args.hidden:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    q = nn.Sequential(*layers, nn.Linear(width, actions))
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=args.lr)
    rows = len(columns[OBS])
    generator = torch.Generator().manual_seed(seed)
    for update in range(1, args.updates + 1):
        picked = torch.randint(rows, (args.batch_size,), generator=generator)
        obs, action, reward, next_obs, terminated = (columns[name][picked]
                                                     for name in (OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS))
        q_values = q(obs)
        q_taken = q_values.gather(1, action.long()[:, None]).squeeze(1)
        with torch.no_grad():
            next_action = q(next_obs).argmax(1, keepdim=True)
            next_q = target(next_obs).gather(1, next_action).squeeze(1)
            td_target = reward + args.gamma * (1.0 - terminated.float()) * next_q
        penalty = (torch.logsumexp(q_values, dim=1) - q_taken).mean()
        loss = F.huber_loss(q_taken, td_target) + args.cql_alpha * penalty
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if update % args.target_update_every == 0:
            target.load_state_dict(q.state_dict())
    return q


def mean_return(q: nn.Module, env_spec: EnvSpec, seeds: list[int]) -> float:
    env, returns = make_env(env_spec), []
    for env_seed in seeds:
        obs, _ = env.reset(seed=env_seed)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs, dtype=torch.float32)[None]).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="dataset name, under --datasets-dir")
    parser.add_argument("--datasets-dir", type=Path, default=SUITE / "datasets")
    parser.add_argument("--references", type=Path, default=SUITE / "references")
    parser.add_argument("--params", default=str(SUITE / "params.yaml"), help="for the evaluation seeds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--updates", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--target-update-every", type=int, default=100)
    parser.add_argument("--cql-alpha", type=float, default=1.0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    params = load_params(args.params)
    dataset_dir = args.datasets_dir / args.dataset
    card = dataset.read_card(dataset_dir)
    mapped = with_n_step(dataset.read_table(dataset_dir), n=1, gamma=args.gamma)
    columns = {name: torch.as_tensor(np.array(mapped[f"{DEFAULT_MODULE_ID}/{name}"]))
               for name in (OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS)}
    if card.env is None:
        raise SystemExit(f"{args.dataset} has no simulator to evaluate on")
    reference = read_reference(args.references, card.env.label, params.evaluate)
    if CEILING not in reference:
        raise SystemExit(f"{args.dataset}: {no_score_reason(card.env.label)}")
    eval_seeds = [episode_seeds(params.evaluate.seed, i)[0] for i in range(params.evaluate.episodes)]
    scores = []
    for seed in args.seeds:
        q = train(columns, card.spaces[1].n, args, seed)
        scores.append(normalized_score(mean_return(q, card.env, eval_seeds), reference))
        print(f"{args.dataset} seed {seed}: normalized {scores[-1]:.1f}", flush=True)
    print(f"{args.dataset}: {np.mean(scores):.1f} ± {np.std(scores):.1f} over seeds {args.seeds}")


if __name__ == "__main__":
    exit_on_user_error(main)
