"""`orl ope` and `orl select`: a trained policy's return estimated from logged episodes alone (no simulator), and
the best run for a dataset chosen by such an estimate.

The evaluated policy is the one `orl evaluate` runs (greedy, or sampling where `evaluate.sample_actions` makes BC,
MARWIL and IQL sample), and the estimates are in its units: the normalized score where the dataset's env has
references, else the return. The estimators are in evaluation/estimators.py.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import gymnasium as gym
import mlflow
import numpy as np

import dataset_format as dataset
import tracking
from common.envs import EnvSpec, time_limit
from common.errors import UserError
from common.observations import ModelInput, is_image
from common.run_dir import RunDir, write_json
from common.trained_policy import ModulePolicy, load_rl_module
from dataset_format import Col
from evaluation.config import DR, ESTIMATORS, FQE, MODEL, SELECT_BY, WPDIS, EvaluateConfig, OPEConfig
from evaluation.estimators import Episodes, Weighted, bootstrap, fit_fqe, log_ratios, resampling_members
from evaluation.model_based import DynamicsEnsemble, fit_dynamics, has_dynamics, rollout_returns
from evaluation.references import CEILING, normalized_score, read_reference
from evaluation.selection import (BEHAVIOUR, Interval, agreed, policy_name, rank_by_lower_bound, rule_name,
                                  stands_above)

# Rows of observations the policy sees at once: bounds memory on large datasets.
POLICY_CHUNK = 65_536

# Why an estimate that applies gave no number: the report's cell for it.
DID_NOT_CONVERGE, OUT_OF_RANGE, UNRELIABLE = "did not converge", "out of range", "unreliable"
# The MLflow tag of estimates made of a softmax version of the run's policy (`orl ope --temperature`): `orl select`
# passes over them, since the run's registered model serves the policy itself.
TEMPERATURE_TAG = "ope.temperature"
# An estimate's value and interval, as ope.json holds them; the MLflow metrics `mlflow_metrics` names carry them.
ESTIMATE_KEYS = ("value", "ci_low", "ci_high")


def mlflow_metrics(estimator: str) -> tuple[str, str, str]:
    """The training run's metrics of an estimator's value, and of its interval's low and high ends."""
    return f"ope/{estimator}", f"ope/{estimator}_ci_low", f"ope/{estimator}_ci_high"


def ope(run_dir: str | Path, dataset_path: str, references_dir: str | Path, config: OPEConfig,
        evaluate_config: EvaluateConfig, estimators: list[str] | None = None, temperature: float | None = None) -> dict:
    """Estimates the run's policy on the dataset with `estimators` (default: every one that applies, the others
    recorded as undefined, with why); writes RUN/ope.json and logs `ope/NAME` metrics to the run's MLflow run. With
    a `temperature`, the policy estimated samples from softmax(logits / temperature) (Discrete actions): importance
    weights then live on every logged action, where a greedy policy's die at the first one it would not take."""
    run = RunDir(Path(run_dir))
    if not run.run_info.is_file():
        raise UserError(f"{run.run_info} is missing: {run.path} is not a finished `orl train` run")
    info = run.info()
    location = dataset.locate(dataset_path)
    card = dataset.read_card(location)
    _require_same_task(run, info, card, location)
    undefined = undefined_estimators(card)
    for name in estimators or []:
        if name in undefined:
            raise UserError(f"{name} cannot evaluate {run.path} on {location}: {undefined[name]}")
    wanted = [name for name in (estimators or ESTIMATORS) if name not in undefined]
    reference = read_reference(references_dir, card.env.label, evaluate_config) if card.env else None
    if reference is not None and CEILING not in reference:  # no normalized score: estimates are returns
        reference = None

    if temperature is not None and not isinstance(card.spaces[1], gym.spaces.Discrete):
        raise UserError(f"--temperature applies to Discrete actions; {location}'s are {card.spaces[1]}")
    sampled = temperature is not None or evaluate_config.sample_actions and info["policy_is_distribution"]
    policy = ModulePolicy(load_rl_module(run.checkpoint), card.spaces[1], greedy=not sampled, temperature=temperature)
    fit, held_out = split_episodes(logged_episodes(location, card), config)
    tracking.connect()  # an unreachable tracking server or a lost run fails before the fitting
    tracking.require_run(info["mlflow_run_id"], run.run_info)
    estimated = (estimate_policy(policy, card, fit, held_out, reference, config, wanted, label=f"ope {run.path.name}")
                 if wanted else {"dataset": card.name, "units": "normalized score" if reference else "return",
                                 "estimates": {}})
    output = {"dataset_path": location.uri, "policy": policy_name(sampled, temperature), **estimated}
    results, behaviour = output["estimates"], output.get(BEHAVIOUR)
    results.update({name: {"undefined": reason} for name, reason in undefined.items()
                    if estimators is None or name in estimators})
    write_json(run.ope_metrics, output)
    with mlflow.start_run(run_id=info["mlflow_run_id"]) as active:
        if temperature is None and TEMPERATURE_TAG in active.data.tags:  # these estimates replace a softmax's
            mlflow.delete_tag(TEMPERATURE_TAG)
        mlflow.log_metrics({metric: r.get(key, math.nan) for name, r in results.items()
                            if "value" in r or "status" in r  # NaN over an earlier estimate that this one voids
                            for metric, key in zip(mlflow_metrics(name), ESTIMATE_KEYS)}
                           | ({"ope/fqe_td_loss": output["fqe_fit"]["td_loss"]} if "fqe_fit" in output else {})
                           | ({"ope/model_left_data": results[MODEL]["left_data"]}
                              if "left_data" in results.get(MODEL, {}) else {})
                           | ({metric: behaviour[key] for metric, key in zip(mlflow_metrics(BEHAVIOUR), ESTIMATE_KEYS)}
                              if behaviour else {}))
        mlflow.set_tags({"ope.dataset": card.name, "ope.policy": output["policy"], "ope.units": output["units"],
                         **({TEMPERATURE_TAG: temperature} if temperature is not None else {}),
                         **{f"ope.{name}": r["undefined"] for name, r in results.items() if "undefined" in r}})
        mlflow.log_artifact(str(run.ope_metrics), "ope")
    for name, r in (results | ({f"{BEHAVIOUR} policy": behaviour} if behaviour else {})).items():
        line = (f"{r['value']:.1f} [{r['ci_low']:.1f}, {r['ci_high']:.1f}] {output['units']}" if "value" in r
                else r["undefined"]) + (f" ({r['left_data']:.0%} of rollouts halted off the data)"
                                        if "left_data" in r else "")
        print(f"[ope {run.path.name}] {name}: {line}", file=sys.stderr)
    return output


def estimate_policy(policy: ModulePolicy, card: dataset.DatasetCard, fit: Episodes, held_out: Episodes,
                    reference: dict | None, config: OPEConfig, estimators: list[str], label: str,
                    dynamics: DynamicsEnsemble | None = None) -> dict:
    """The policy's value by each of `estimators` (which must apply), fitting FQE (where an estimator reads it) or the
    dynamics on `fit` and estimating on `held_out`, in normalized units where there is a `reference`. `dynamics`: the
    model-based estimator's, fitted on `fit` already (`fit_dynamics`); they do not depend on the policy, so one fit
    serves every policy estimated on the same episodes."""
    horizon = episode_horizon(card.env, fit, held_out)
    print(f"[{label}] {len(held_out)} episodes of {card.name} to estimate on, fitted on {len(fit)}; horizon "
          f"{horizon}, gamma {config.gamma}", file=sys.stderr, flush=True)
    action_space = card.spaces[1]
    discrete = isinstance(action_space, gym.spaces.Discrete)
    results: dict[str, dict] = {}
    q = None
    if {FQE, WPDIS, DR} & set(estimators):  # all three read FQE's fit (its values, or the returns it allows)
        q = fit_fqe(fit, _pi(policy, fit.arrays[Col.NEW_OBS], discrete, config.seed),
                    action_space.n if discrete else None, horizon, config, fit_progress(label),
                    ModelInput.of(card.spaces[0]))
        a = held_out.arrays
        pi = _pi(policy, a[Col.OBS], discrete, config.seed)
        v = q.values(a[Col.OBS], a[Col.T], pi)
        allowed = q.return_range()
    if FQE in estimators:
        initial = v[held_out.starts]  # (episodes, heads)
        results[FQE] = _estimate(float(initial.mean()), resampling_members(initial, config.seed), len(held_out),
                                 config, reference, allowed)
    if WPDIS in estimators or DR in estimators:
        weighted = Weighted.of(held_out, log_ratios(held_out, pi),
                               q.q(a[Col.OBS], a[Col.T], a[Col.ACTIONS]).mean(axis=1), v.mean(axis=1), config.gamma)
        effective = weighted.effective_episodes()
        for name, statistic in ((WPDIS, Weighted.wpdis), (DR, Weighted.wdr)):
            if name in estimators:
                results[name] = _estimate(statistic(weighted), lambda s, f=statistic: f(weighted.resampled(s)),
                                          len(held_out), config, reference, allowed)
                results[name]["effective_episodes"] = effective
        # Doubly robust falls back on FQE where the weights die; weighted importance sampling has nothing to fall on.
        if WPDIS in estimators and effective < config.min_effective_episodes:
            results[WPDIS] = {"undefined": f"its importance weights collapsed: {effective:.1f} effective episodes "
                                           f"(Kish) of {len(held_out)}, fewer than ope.min_effective_episodes "
                                           f"({config.min_effective_episodes:g}); no estimate",
                              "status": UNRELIABLE, "effective_episodes": effective}
    if MODEL in estimators:
        results[MODEL] = (
            _model_based(policy, dynamics if dynamics is not None else fit_model(fit, action_space, config, label),
                         held_out, discrete, horizon, config, reference)
            if has_dynamics(fit) else
            {"undefined": f"every step of {card.name} fitted on ends its episode (one-step episodes), leaving the "
                          "model-based estimator no step that goes on to learn the dynamics from; use fqe"})
    if q is not None and not q.fit.converged:  # FQE's values, and DR's baseline, are no estimate
        reason = (f"FQE did not converge: its final TD loss {q.fit.td_loss:.4g} is above the variance of the logged "
                  f"returns-to-go ({q.fit.td_loss_limit:.4g}); no estimate")
        results.update({name: {"undefined": reason, "status": DID_NOT_CONVERGE, "td_loss": q.fit.td_loss}
                        for name in (FQE, DR) if name in results})
    logged = held_out.returns_to_go(config.gamma)[held_out.starts]  # each episode's return under the behaviour
    behaviour = _estimate(float(logged.mean()), lambda sample: float(logged[sample].mean()), len(held_out), config,
                          reference, (float(logged.min()), float(logged.max())))
    same = fit is held_out
    return {
        "dataset": card.name, "units": "normalized score" if reference else "return", "horizon": horizon,
        "gamma": config.gamma,
        "episodes": {"total": len(fit) + (0 if same else len(held_out)), "fit": len(fit),
                     "estimated_on": len(held_out), "held_out_fraction": config.held_out_fraction,
                     "split_seed": config.seed},
        **({"fqe_fit": {"td_loss_start": q.fit.td_loss_start, "td_loss": q.fit.td_loss,
                        "td_loss_limit": q.fit.td_loss_limit, "converged": q.fit.converged},
            "returns_allowed": list(allowed)} if q is not None else {}),
        BEHAVIOUR: behaviour,
        "estimates": results,
    }


def select(dataset_name: str, estimators: list[str] | None = None) -> None:
    """Chooses, among the finished MLflow runs trained on the dataset, the one the rule of evaluation/selection.py
    picks (the highest lower bound; by several estimators, the highest of each run's lowest lower bound), says
    whether its interval stands clear of the runner-up's, and points the registry alias DATASET-ope-best at its model
    version (taking it from any other model). Refuses, setting nothing, where no run stands above the behaviour
    policy. By default, by the estimators of `SELECT_BY` that were run on the dataset (the model-based estimator is
    not on images)."""
    tracking.connect()
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list",
                              filter_string=f"tags.dataset = '{dataset_name}' and attributes.status = 'FINISHED'")
    if estimators is None:
        estimators = [e for e in SELECT_BY if any(mlflow_metrics(e)[0] in r.data.metrics for r in runs)]
        estimators = estimators or list(SELECT_BY)
    metrics = ("the metric " if len(estimators) == 1 else "the metrics ") + " and ".join(
        mlflow_metrics(e)[0] for e in estimators)
    rule = rule_name(estimators)
    agreed_by_run = {r.info.run_id: _agreed(r.data.metrics, estimators) for r in runs}
    candidates = [r for r in runs if agreed_by_run[r.info.run_id].finite and TEMPERATURE_TAG not in r.data.tags]
    if not candidates:
        raise UserError(f"no finished MLflow run trained on dataset '{dataset_name}' has {metrics} of its "
                        f"own policy (tracking store {tracking.tracking_uri()}); run `orl ope` (or dvc repro) first, "
                        "without --temperature")
    client = mlflow.MlflowClient()
    versions = {r.info.run_id: client.search_model_versions(f"run_id = '{r.info.run_id}'") for r in candidates}
    runs_by_id = {r.info.run_id: r for r in candidates if versions[r.info.run_id]}
    if not runs_by_id:
        raise UserError(f"no run with {metrics} on dataset '{dataset_name}' has a registered model version")
    estimates = {run_id: agreed_by_run[run_id] for run_id in runs_by_id}
    ranked = [runs_by_id[run_id] for run_id in rank_by_lower_bound(estimates)]
    best = ranked[0]
    for r in ranked:
        each = ", ".join(f"{mlflow_metrics(e)[0]} {_describe(_interval(r.data.metrics, e))}" for e in estimators)
        together = f" -> {rule} {_describe(estimates[r.info.run_id])}" if len(estimators) > 1 else ""
        print(f"[select {dataset_name}] {r.info.run_name}: {each}{together}"
              + ("  <- the highest lower bound" if r is best else ""), file=sys.stderr)
    _require_above_behaviour(dataset_name, best, estimates[best.info.run_id], rule)
    chosen = versions[best.info.run_id][0]
    alias = f"{dataset_name}-ope-best"
    for name in {v.name for found in versions.values() for v in found} - {chosen.name}:
        if alias in client.get_registered_model(name).aliases:
            client.delete_registered_model_alias(name, alias)
    client.set_registered_model_alias(chosen.name, alias, chosen.version)
    runner_up = ranked[1] if len(ranked) > 1 else None
    clear = runner_up is None or stands_above(estimates[best.info.run_id], estimates[runner_up.info.run_id])
    confidence = ("the only candidate" if runner_up is None else
                  f"its interval stands clear of the runner-up's ({runner_up.info.run_name})" if clear else
                  f"its interval overlaps the runner-up's ({runner_up.info.run_name}): the data does not tell "
                  "them apart")
    print(f"[select {dataset_name}] alias {alias} -> models:/{chosen.name}/{chosen.version} "
          f"(run {best.info.run_name}, the highest lower bound by {rule}; {confidence})", file=sys.stderr)


def _interval(metrics: dict, estimator: str) -> Interval:
    """An estimator's interval from a run's MLflow metrics (`mlflow_metrics`); NaN where one is missing."""
    return Interval(*(metrics.get(name, math.nan) for name in mlflow_metrics(estimator)))


def _agreed(metrics: dict, estimators: list[str]) -> Interval:
    return agreed([_interval(metrics, e) for e in estimators])


def _describe(interval: Interval) -> str:
    return f"{interval.value:.1f} [{interval.low:.1f}, {interval.high:.1f}]"


def _require_above_behaviour(dataset_name: str, best, pick: Interval, rule: str) -> None:
    """The pick must stand above the behaviour policy's interval (its run's `ope/behaviour` metrics): otherwise the
    data does not show that it does better than what logged it."""
    behaviour = _interval(best.data.metrics, BEHAVIOUR)
    if not behaviour.finite:
        raise UserError(f"run {best.info.run_name} has no ope/{BEHAVIOUR} metric (its estimates predate it); run "
                        f"`orl ope` on it again")
    print(f"[select {dataset_name}] {BEHAVIOUR} policy (its logged returns): {_describe(behaviour)}", file=sys.stderr)
    if not stands_above(pick, behaviour):
        raise UserError(f"no run on dataset '{dataset_name}' stands above its behaviour policy: the highest lower "
                        f"bound, {pick.low:.1f} ({rule} of {best.info.run_name}), is within the behaviour's "
                        f"interval [{behaviour.low:.1f}, {behaviour.high:.1f}] or below it; no alias set (keep the "
                        "behaviour policy, or train on more data)")


def _require_same_task(run: RunDir, info: dict, card: dataset.DatasetCard, location: dataset.Location) -> None:
    """The dataset must come from the run's env (or, without one, have the spaces of the run's own dataset)."""
    if card.env_id != info["env_id"]:
        def what(env_id):
            return f"{env_id} episodes" if env_id else "data without an env"
        raise UserError(f"{location} holds {what(card.env_id)} but {run.path} was trained on {what(info['env_id'])}; "
                        "pass a dataset of the same env")
    if card.env_id is None and card.name != info["dataset"]:
        trained_on = dataset.read_card(info["dataset_path"])
        if (trained_on.observation_space, trained_on.action_space) != (card.observation_space, card.action_space):
            raise UserError(f"{location} has other observation or action spaces than {info['dataset_path']}, "
                            f"which {run.path} was trained on")


def undefined_estimators(card: dataset.DatasetCard) -> dict[str, str]:
    """The estimators that cannot evaluate a policy on this dataset, with why."""
    observation_space, action_space = card.spaces
    undefined = {}
    if isinstance(observation_space, gym.spaces.Discrete) or is_image(observation_space):
        kind = "images" if is_image(observation_space) else "Discrete states"
        undefined[MODEL] = (f"the model-based estimator learns the dynamics of vector observations, and {card.name}'s "
                            f"are {kind}; use fqe")
    if not isinstance(action_space, gym.spaces.Discrete):
        weights = ("a policy on continuous actions acts deterministically here (or samples and clips to the bounds), "
                   "so its actions have no density for importance weights; use fqe")
    elif not card.has_action_logp:
        weights = (f"{card.name} has no {Col.ACTION_LOGP} column (its behaviour policy's action probabilities are "
                   "unknown); use fqe")
    else:
        return undefined
    return undefined | {WPDIS: weights, DR: weights}


def logged_episodes(location: dataset.Location, card: dataset.DatasetCard) -> Episodes:
    """The dataset's episodes, validated; images held once per distinct frame (a frame stack's transition holds
    eight)."""
    observation_space = card.spaces[0]
    if is_image(observation_space):
        return Episodes.of(dataset.load_frame_arrays(location, ModelInput.of(observation_space).channels_first))
    return Episodes.of(dataset.load_arrays(location))


def split_episodes(episodes: Episodes, config: OPEConfig) -> tuple[Episodes, Episodes]:
    """(episodes FQE is fitted on, episodes the estimates are computed on): with held_out_fraction, a seeded draw
    of episode ids and the rest; else every episode, both times."""
    if not config.held_out_fraction:
        return episodes, episodes
    count = max(1, round(config.held_out_fraction * len(episodes)))
    if count >= len(episodes):
        raise UserError(f"ope.held_out_fraction {config.held_out_fraction} leaves no episode of {len(episodes)} "
                        "to fit FQE on; lower it")
    held_out = np.zeros(len(episodes), dtype=bool)
    held_out[np.random.default_rng(config.seed).choice(len(episodes), size=count, replace=False)] = True
    return episodes.select(np.flatnonzero(~held_out)), episodes.select(np.flatnonzero(held_out))


def episode_horizon(env: EnvSpec | None, *episodes: Episodes) -> int:
    """The env's time limit (the longest logged episode without an env or a limit, or when longer)."""
    limit = time_limit(env) if env else None
    return int(max([limit or 0, *(e.lengths.max() for e in episodes)]))


def _model_based(policy: ModulePolicy, model: DynamicsEnsemble, held_out: Episodes, discrete: bool, horizon: int,
                 config: OPEConfig, reference: dict | None) -> dict:
    """The policy rolled out in the fitted dynamics, from each held-out episode's first state; the interval
    resamples the networks of the ensemble with the episodes. `left_data`: the share of rollouts that halted where
    the networks disagree (each counted at its chance of not having ended before)."""
    starts = held_out.arrays[Col.OBS][held_out.starts]
    returns, halted = rollout_returns(model, actor(policy, discrete, config.seed), starts, horizon,
                                      config.gamma)  # (episodes, networks)
    estimate = _estimate(float(returns.mean()), resampling_members(returns, config.seed), len(held_out), config,
                         reference, model.return_range(horizon))
    return estimate | {"left_data": float(halted.mean())}


def actor(policy: ModulePolicy, discrete: bool, seed: int):
    """The policy's actions at a batch of states, as `orl evaluate` takes them: its mode when greedy, else a draw."""
    rng = np.random.default_rng([seed, 1])

    def act(obs: np.ndarray) -> np.ndarray:
        if not discrete:
            return policy.act(obs, None if policy.greedy else rng.spawn(len(obs)), envs=None)[0]
        probabilities = policy.probabilities(obs)
        if policy.greedy:
            return probabilities.argmax(axis=1)
        return (probabilities.cumsum(axis=1) > rng.random((len(obs), 1))).argmax(axis=1)
    return act


def _pi(policy: ModulePolicy, obs: np.ndarray, discrete: bool, seed: int) -> np.ndarray:
    """The policy at each state: action probabilities (Discrete) or its action (Box)."""
    chunks = []
    for start in range(0, len(obs), POLICY_CHUNK):
        batch = obs[start:start + POLICY_CHUNK]
        if discrete:
            chunks.append(policy.probabilities(batch))
        else:
            rngs = None if policy.greedy else np.random.default_rng([seed, start]).spawn(len(batch))
            chunks.append(policy.act(batch, rngs, envs=None)[0])
    return np.concatenate(chunks)


def _estimate(value: float, statistic, episodes: int, config: OPEConfig, reference: dict | None,
              allowed: tuple[float, float]) -> dict:
    """An estimate and its bootstrap interval, in normalized units where there are references (with the raw
    return beside it); none where the return lies outside the `allowed` range (FQE's `return_range`)."""
    slack = 1e-6 * (allowed[1] - allowed[0])  # float rounding at the ends
    if not allowed[0] - slack <= value <= allowed[1] + slack:
        return {"undefined": f"its return {value:.4g} is outside the returns the data allows "
                             f"[{allowed[0]:.4g}, {allowed[1]:.4g}]; no estimate", "status": OUT_OF_RANGE}
    low, high = bootstrap(statistic, episodes, config)
    if reference is None:
        return {"value": value, "ci_low": low, "ci_high": high}
    return {"value": normalized_score(value, reference), "ci_low": normalized_score(low, reference),
            "ci_high": normalized_score(high, reference), "return": value}


def fit_model(fit: Episodes, action_space: gym.Space, config: OPEConfig, label: str) -> DynamicsEnsemble:
    """The model-based estimator's dynamics, fitted on `fit`, with progress lines under `label`."""
    discrete = isinstance(action_space, gym.spaces.Discrete)
    return fit_dynamics(fit, action_space.n if discrete else None, config, fit_progress(label, "model network", "loss"))


def fit_progress(label: str, step: str = "fqe iteration", loss_name: str = "TD loss"):
    """A fit's progress, at most about ten lines."""
    def report(done: int, total: int, loss: float) -> None:
        if done % max(1, total // 10) == 0 or done == total:
            print(f"[{label}] {step} {done}/{total}, {loss_name} {loss:.4g}", file=sys.stderr, flush=True)
    return report


