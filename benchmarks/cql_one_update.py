"""One gradient update of our CQL and of d3rlpy's, from the same weights and the same batch: do they compute the
same update?

Builds our CQL on the dataset with params.yaml's settings (its `per_dataset` values included) and its target critics
at the policy's mean next action (`target_action: mean`, d3rlpy's backup, so that the targets hold no sampling), trains
it `--updates-before` updates, and takes one batch. d3rlpy's CQL, in its own virtualenv, is given the same weights
(policy, critics, target critics, entropy temperature, conservative weight) and the batch. Both then compute every
term of the update: the exact ones once (Q on the data's actions, the policy's Gaussian, the targets, the TD error)
and the sampled ones (the conservative gap, the policy's log-density and loss, and every gradient) over `--draws`
draws. A sampled term's difference is printed with its standard error; the gradients are compared per network, by the
cosine and the ratio of norms of two means of half the draws each: ours against d3rlpy's, and ours against ours, the
sampling's own spread. A term that differs by more than that spread differs in what it computes.

The two order an update differently: d3rlpy steps its conservative weight, then its critics, then its temperature and
its policy, each loss after the steps before it; ours computes every loss from the weights before the update. d3rlpy's
side runs its own losses, which step the conservative weight and the temperature before using them (each draw starts
again from the shared values); its critics and policy are not stepped, so the order of the critics' and the policy's
steps is what one update from the same weights does not show.

    python -m benchmarks.cql_one_update --params benchmarks/mujoco/params.yaml \\
        --dataset benchmarks/mujoco/datasets/hopper-random --updates-before 5000

`--save-weights FILE` also writes the weights both start from, by d3rlpy's names, with the temperature and the
conservative weight: with `--updates-before 0`, our CQL's initial weights at `--seed`, which d3rlpy_runner.py's
`initial_weights` setting starts d3rlpy's CQL from. `start_from` starts ours from such a file (quality_table.py's
`--initial-weights`), d3rlpy's initial weights included (`d3rlpy_runner.py --save-initial-weights`).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
# Our module's networks by d3rlpy's names (parameters of `CQLModules`), layer by layer: our MLPs' Linear layers sit at
# net.mlp.0 and net.mlp.2 (ReLU between), d3rlpy's at _layers.0 and _layers.2.
CRITICS = {"qf": "q_funcs.0", "qf_twin": "q_funcs.1", "target_qf": "targ_q_funcs.0", "target_qf_twin": "targ_q_funcs.1"}
# RLlib's heads keep the bound of their log-deviation outputs as a buffer, which d3rlpy's hold as a setting.
CLIP_CONSTANT = "log_std_clip_param_const"
# RLlib's squashed Gaussian clips its log-deviations at -5 (MIN_LOG_NN_OUTPUT), d3rlpy's at -20: the share of the
# policy's outputs under -5, where the two policies differ.
RLLIB_LOG_STD_FLOOR = -5.0
UNDER_FLOOR = "policy_log_std_under_-5"
# Parameters of one number each, by the name both sides give them.
SCALAR_PARAMETERS = ("log_temperature", "log_conservative_weight")
# The gradients compared, by the prefix of d3rlpy's names.
GRADIENT_GROUPS = {"critic 1": "q_funcs.0.", "critic 2": "q_funcs.1.", "policy": "policy.",
                   "entropy temperature": "log_temperature", "conservative weight": "log_conservative_weight"}


def d3rlpy_name(ours: str) -> str | None:
    """d3rlpy's name of one of our module's parameters (`pi` splits in two: see `to_d3rlpy`)."""
    network, _, rest = ours.partition(".")
    layer = rest.replace("net.mlp.", "_layers.")
    if network == "pi_encoder":
        return f"policy._encoder.{layer}"
    for prefix, critic in CRITICS.items():
        if network == f"{prefix}_encoder":
            return f"{critic}._encoder.{layer}"
        if network == prefix:
            return f"{critic}._fc.{rest.rpartition('.')[2]}"
    return None


def to_d3rlpy(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our module's weights under d3rlpy's names. Our policy head gives the Gaussian's means and log-deviations from
    one Linear layer (halves of its outputs), d3rlpy's from two."""
    out = {}
    for name, tensor in weights.items():
        if name.endswith(CLIP_CONSTANT):
            continue
        if name.startswith("pi."):
            mu, logstd = tensor.chunk(2, dim=0)
            kind = name.rpartition(".")[2]
            out[f"policy._mu.{kind}"], out[f"policy._logstd.{kind}"] = mu, logstd
        elif (mapped := d3rlpy_name(name)) is not None:
            out[mapped] = tensor
    return out


def from_d3rlpy(weights: dict[str, torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    """`to_d3rlpy`'s inverse: by our module's parameter `names`, the tensors of `weights` (by d3rlpy's names)."""
    out = {}
    for name in names:
        if name.startswith("pi."):
            kind = name.rpartition(".")[2]
            out[name] = torch.cat([weights[f"policy._mu.{kind}"], weights[f"policy._logstd.{kind}"]])
        elif (mapped := d3rlpy_name(name)) is not None and mapped in weights:
            out[name] = weights[mapped]
    return out


def copy_networks(module: torch.nn.Module, saved: dict, path: Path) -> dict[str, torch.Tensor]:
    """Sets every parameter of our CQL's `module` to `saved`'s weights (by d3rlpy's names, read from `path`), all
    checked before any is set; returns them by our names."""
    parameters = dict(module.named_parameters())
    weights = from_d3rlpy(saved["weights"], list(parameters))
    if set(weights) != set(parameters):
        raise SystemExit(f"{path}: its weights do not map onto our CQL's networks (sizes from params.yaml's "
                         "hidden_layers and the dataset's spaces)")
    for name, parameter in parameters.items():
        if parameter.shape != weights[name].shape:
            raise SystemExit(f"{path}: {name} is {tuple(weights[name].shape)} there, "
                             f"{tuple(parameter.shape)} in our CQL")
    with torch.no_grad():
        for name, parameter in parameters.items():
            parameter.copy_(weights[name])
    return weights


def start_from(algorithm, path: Path) -> None:
    """Sets a built CQL of ours (`num_learners` 0) to the weights `path` holds by d3rlpy's names, its networks, entropy
    temperature and conservative weight: our initial weights as `--save-weights` writes them, or d3rlpy's as
    `d3rlpy_runner.py --save-initial-weights` does."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from training.algorithms.rllib_internals import local_learner

    saved = torch.load(path)
    learner = local_learner(algorithm)
    weights = copy_networks(learner.module[DEFAULT_MODULE_ID], saved, path)
    if set(to_d3rlpy(weights)) != set(saved["weights"]):
        raise SystemExit(f"{path}: it holds weights our CQL has no network for: "
                         f"{sorted(set(saved['weights']) - set(to_d3rlpy(weights)))}")
    with torch.no_grad():
        learner.curr_log_alpha[DEFAULT_MODULE_ID].fill_(saved["log_temperature"])
        log_weight = learner.log_conservative_weights.get(DEFAULT_MODULE_ID)  # none where it is fixed
        if log_weight is not None:
            log_weight.fill_(saved["log_conservative_weight"])
        elif saved["log_conservative_weight"] != 0.0:
            raise SystemExit(f"{path}: its conservative weight is {math.exp(saved['log_conservative_weight']):.3g} "
                             "times min_q_weight, where ours holds it at 1 (no lagrangian_threshold in params.yaml)")


def ours(args) -> tuple[dict, dict]:
    """(what d3rlpy's side needs, our terms): each term a list of per-draw values."""
    import dataclasses

    from ray.rllib.algorithms.sac.sac_learner import QF_PREDS, QF_TWIN_PREDS
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.columns import Columns

    from common.ray_runtime import start_ray
    from pipelines.params import load_params
    from training.algorithms.offline_cql import conservative_gap
    from training.algorithms.registry import rllib_config
    from training.algorithms.rllib_internals import local_learner, temp_losses
    from training.config import MEAN

    params = load_params(args.params)
    configured = params.algos.get("cql").for_dataset(args.dataset.name)
    if configured.lagrangian_threshold is None:
        raise SystemExit("cql_one_update.py compares the learned conservative weight; params.yaml's cql has no "
                         "lagrangian_threshold")
    cql = dataclasses.replace(configured, target_action=MEAN, iterations=1,
                              updates_per_iteration=max(args.updates_before, 1))
    start_ray(params.ray.num_cpus)
    torch.manual_seed(args.seed)
    algorithm = rllib_config("cql", cql, args.dataset, seed=args.seed).build_algo()
    try:
        if args.updates_before:
            print(f"[cql_one_update] our CQL: {args.updates_before:,} updates on {args.dataset.name}", flush=True)
            algorithm.train()
        learner = local_learner(algorithm)
        module = learner.module[DEFAULT_MODULE_ID]
        config = learner.config.get_config_for_module(DEFAULT_MODULE_ID)
        sample = algorithm.offline_data.sample(num_samples=cql.batch_size, num_shards=0)[DEFAULT_MODULE_ID]
        batch = {key: torch.as_tensor(np.asarray(sample[key]), dtype=torch.float32)
                 for key in (Columns.OBS, Columns.ACTIONS, Columns.NEXT_OBS, Columns.REWARDS, Columns.TERMINATEDS)}
        names = {learner.get_param_ref(p): name for name, p in module.named_parameters()}
        names[learner.get_param_ref(learner.curr_log_alpha[DEFAULT_MODULE_ID])] = "log_temperature"
        log_weight = learner.log_conservative_weights[DEFAULT_MODULE_ID]
        names[learner.get_param_ref(log_weight)] = "log_conservative_weight"
        terms: dict[str, list] = {}
        for _ in range(args.draws):
            fwd_out = module.forward_train(batch)
            loss = learner.compute_loss_for_module(module_id=DEFAULT_MODULE_ID, config=config, batch=batch,
                                                   fwd_out=fwd_out)
            actor_loss = temp_losses(learner)[(DEFAULT_MODULE_ID, "policy_loss")].item()
            grads = learner.compute_gradients({DEFAULT_MODULE_ID: loss})
            with torch.no_grad():
                target = batch[Columns.REWARDS] + config.gamma * (1 - batch[Columns.TERMINATEDS]) * fwd_out[
                    "q_target_next"]
                draw = {"q_data": fwd_out[QF_PREDS].mean().item(), "q_twin_data": fwd_out[QF_TWIN_PREDS].mean().item(),
                        "target": target.mean().item(),
                        "td_loss": sum(torch.mean((fwd_out[key] - target) ** 2) for key in (QF_PREDS, QF_TWIN_PREDS))
                        .item(),
                        "conservative_gap": conservative_gap(config, fwd_out).item(),
                        "policy_logp": fwd_out["logp_resampled"].mean().item(), "actor_loss": actor_loss}
            for key, value in draw.items():
                terms.setdefault(key, []).append(value)
            named = {names[ref]: gradient.clone() for ref, gradient in grads.items()}
            for name, gradient in (to_d3rlpy(named) | {key: named[key] for key in SCALAR_PARAMETERS}).items():
                terms.setdefault(f"grad:{name}", []).append(gradient)
        weights = {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}
        mean, log_std = fwd_out[Columns.ACTION_DIST_INPUTS].chunk(2, dim=-1)
        terms["policy_mean"], terms["policy_log_std"] = [mean.mean().item()], [log_std.mean().item()]
        terms[UNDER_FLOOR] = [(log_std < RLLIB_LOG_STD_FLOOR).float().mean().item()]
        shared = {"weights": to_d3rlpy(weights), "batch": {key: value.numpy() for key, value in batch.items()},
                  "log_temperature": learner.curr_log_alpha[DEFAULT_MODULE_ID].item(),
                  "log_conservative_weight": log_weight.item(),
                  "settings": {"gamma": config.gamma, "tau": config.tau, "hidden": list(cql.hidden_layers),
                               "conservative_weight": cql.min_q_weight, "threshold": cql.lagrangian_threshold,
                               "n_action_samples": cql.num_actions, "draws": args.draws, "seed": args.seed}}
        return shared, terms
    finally:
        algorithm.stop()


def d3rlpy_side(shared_path: Path, out_path: Path) -> None:
    """d3rlpy's terms, in its own virtualenv, from the weights and batch `ours` saved; gradients by d3rlpy's names."""
    import d3rlpy
    from d3rlpy.models.torch import get_parameter
    from d3rlpy.torch_utility import TorchMiniBatch
    from d3rlpy_runner import copy_weights, network_parameters  # beside this file, run as a script there

    shared = torch.load(shared_path, weights_only=False)
    settings, batch = shared["settings"], shared["batch"]
    torch.manual_seed(settings["seed"])
    encoder = d3rlpy.models.VectorEncoderFactory(hidden_units=settings["hidden"])
    algo = d3rlpy.algos.CQLConfig(actor_encoder_factory=encoder, critic_encoder_factory=encoder,
                                  gamma=settings["gamma"], tau=settings["tau"],
                                  conservative_weight=settings["conservative_weight"],
                                  alpha_threshold=settings["threshold"],
                                  n_action_samples=settings["n_action_samples"]).create(device="cpu:0")
    obs, actions = batch["obs"], batch["actions"]
    algo.create_impl((obs.shape[1],), actions.shape[1])
    impl, modules = algo.impl, algo.impl.modules
    parameters = network_parameters(modules)
    log_temperature, log_weight = get_parameter(modules.log_temp), get_parameter(modules.log_alpha)
    copy_weights(modules, shared)

    def tensor(key: str) -> torch.Tensor:
        return torch.as_tensor(batch[key], dtype=torch.float32)

    rows, critics = len(obs), len(modules.q_funcs)
    mini = TorchMiniBatch(observations=tensor("obs"), actions=tensor("actions"), rewards=tensor("rewards").view(-1, 1),
                          next_observations=tensor("new_obs"), next_actions=tensor("actions"),
                          returns_to_go=torch.zeros(rows, 1), terminals=tensor("terminateds").view(-1, 1),
                          intervals=torch.ones(rows, 1), device="cpu:0")
    temperature = math.exp(shared["log_temperature"])
    terms: dict[str, list] = {}
    for _ in range(settings["draws"]):
        with torch.no_grad():  # d3rlpy's losses step the two as they go: each draw starts from the shared values
            log_temperature.fill_(shared["log_temperature"])
            log_weight.fill_(shared["log_conservative_weight"])
        for p in (*parameters.values(), log_temperature, log_weight):
            p.grad = None
        q_tpn = impl.compute_target(mini)
        critic = impl.compute_critic_loss(mini, q_tpn)  # steps the conservative weight first, as its update does
        gradients = {"log_conservative_weight": log_weight.grad.view(1).clone()}
        critic.critic_loss.backward()
        # Taken before the policy's loss, which reaches the critics too (its actions' Q); ours keeps them apart.
        gradients |= {name: p.grad.clone() for name, p in parameters.items() if name.startswith("q_funcs.")}
        action = modules.policy(mini.observations)
        actor = impl.compute_actor_loss(mini, action)  # steps the temperature first, from its loss -t (log p - A)
        # Ours learns log t from -log t (log p - A): its gradient is d3rlpy's over t.
        gradients["log_temperature"] = log_temperature.grad.view(1) / temperature
        actor.actor_loss.backward()
        gradients |= {name: p.grad.clone() for name, p in parameters.items() if name.startswith("policy.")}
        with torch.no_grad():
            q_data = [q(mini.observations, mini.actions).q_value for q in modules.q_funcs]
            target = mini.rewards + settings["gamma"] * (1 - mini.terminals) * q_tpn
            # Its conservative loss, the weight times the sum over critics of min_q_weight (gap - threshold).
            gap = critic.conservative_loss / (critic.alpha * settings["conservative_weight"] * critics)
            draw = {"q_data": q_data[0].mean().item(), "q_twin_data": q_data[1].mean().item(),
                    "target": target.mean().item(),
                    "td_loss": sum(torch.mean((q - target) ** 2) for q in q_data).item(),
                    "conservative_gap": gap.item() + settings["threshold"],
                    "policy_logp": actions.shape[1] - actor.temp_loss.item() / temperature,
                    "actor_loss": actor.actor_loss.item()}
        for key, value in draw.items():
            terms.setdefault(key, []).append(value)
        for name, gradient in gradients.items():
            terms.setdefault(f"grad:{name}", []).append(gradient)
    output = modules.policy(mini.observations)
    terms["policy_mean"], terms["policy_log_std"] = [output.mu.mean().item()], [output.logstd.mean().item()]
    terms[UNDER_FLOOR] = [(output.logstd < RLLIB_LOG_STD_FLOOR).float().mean().item()]
    torch.save(terms, out_path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--dataset", type=Path, help="a continuous-action dataset's directory (required)")
    parser.add_argument("--updates-before", type=int, default=0, help="our updates before the one compared")
    parser.add_argument("--draws", type=int, default=200,
                        help="draws of the sampled terms (at least 2), each mean over these")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--d3rlpy-python", help="the d3rlpy virtualenv's python (default: quality_table.py's)")
    parser.add_argument("--save-weights", type=Path, metavar="FILE",
                        help="also write the weights both start from (d3rlpy_runner.py's initial_weights)")
    parser.add_argument("--d3rlpy-side", nargs=2, type=Path, metavar=("SHARED", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.d3rlpy_side:
        d3rlpy_side(*args.d3rlpy_side)
        return
    if args.dataset is None:
        parser.error("--dataset is required")
    if args.draws < 2:
        parser.error("--draws: at least 2, to compare the halves of the draws")
    from benchmarks.quality_table import D3RLPY_PYTHON  # not at the top: d3rlpy's virtualenv runs this file too

    shared, terms = ours(args)
    if args.save_weights:
        torch.save({key: shared[key] for key in ("weights", "log_temperature", "log_conservative_weight")},
                   args.save_weights)
        print(f"[cql_one_update] the weights: {args.save_weights}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        shared_path, out_path = Path(tmp) / "shared.pt", Path(tmp) / "d3rlpy.pt"
        torch.save(shared, shared_path)
        command = [args.d3rlpy_python or str(D3RLPY_PYTHON), __file__, "--d3rlpy-side", str(shared_path), str(out_path)]
        run = subprocess.run(command, capture_output=True, text=True)  # d3rlpy's import warns of gym, unused here
        if run.returncode:
            raise SystemExit(f"d3rlpy's side failed: {(run.stderr.strip().splitlines() or ['no output'])[-1]}")
        theirs = torch.load(out_path, weights_only=False)
    print(report(terms, theirs))


def halves(values: list) -> tuple:
    """The means of the first half of `values` and of the second."""
    half = len(values) // 2
    return sum(values[:half]) / half, sum(values[half:]) / (len(values) - half)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


def report(ours: dict, theirs: dict) -> str:
    """Each term, ours beside d3rlpy's. A sampled term's difference is given with its standard error; the gradients
    are compared between the means of half the draws each, ours against d3rlpy's and ours against ours."""
    lines = ["| term | ours | d3rlpy's | difference | its standard error |", "|---|---|---|---|---|"]
    for key in [key for key in ours if not key.startswith("grad:")]:
        mine, other = np.asarray(ours[key]), np.asarray(theirs[key])
        sampled = np.ptp(mine) > 0 or np.ptp(other) > 0
        error = (f"{math.sqrt(mine.var(ddof=1) / len(mine) + other.var(ddof=1) / len(other)):.4f}"
                 if sampled else "exact")
        lines.append(f"| {key} | {mine.mean():.4f} | {other.mean():.4f} | {other.mean() - mine.mean():+.4f} | "
                     f"{error} |")
    lines += ["", "| gradient (means of half the draws) | cosine, ours and d3rlpy's | norm, d3rlpy's / ours | "
                  "cosine, ours and ours | norm, ours / ours |", "|---|---|---|---|---|"]
    for group, prefix in GRADIENT_GROUPS.items():
        keys = sorted(key for key in ours if key.startswith(f"grad:{prefix}"))
        if sorted(key for key in theirs if key.startswith(f"grad:{prefix}")) != keys:
            raise SystemExit(f"the two sides' gradients of the {group} differ in their tensors")

        def stacked(terms: dict, half: int) -> torch.Tensor:
            return torch.cat([halves(terms[key])[half].flatten() for key in keys])

        first, second, other = stacked(ours, 0), stacked(ours, 1), stacked(theirs, 0)
        lines.append(f"| {group} | {cosine(first, other):.3f} | {other.norm() / first.norm():.3f} | "
                     f"{cosine(first, second):.3f} | {second.norm() / first.norm():.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
