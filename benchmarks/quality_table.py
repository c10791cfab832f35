"""The D4RL-style quality table: our offline learners and d3rlpy's, on the same Parquet files, side by side.

For every dataset: the behaviour policy's normalized score, then each of our algorithms (hyper-parameters from
params.yaml's `algos`, their `per_dataset` values included, as the pipeline uses them) and d3rlpy's counterparts
(DiscreteBC/DiscreteCQL, or BC/CQL/IQL for continuous actions) with the same network, batch size, learning rate and
number of gradient updates. Every learner runs once per training seed and is evaluated greedily on the pipeline's
evaluation seeds (`evaluate` in params.yaml); cells are normalized score mean ± std over training seeds.

    python benchmarks/quality_table.py --datasets cartpole-medium cartpole-expert --seeds 0 1 2

d3rlpy runs in its own virtualenv (`--d3rlpy-python`, see benchmarks/quality.md); `--no-d3rlpy` leaves it out.
Writes OUT/quality.md, OUT/quality.json (every per-seed score and each evaluation episode's return, with each cell's
training seeds, updates scale, values set and hyper-parameters) and OUT/quality.png, after every cell; `--update`
keeps the cells (dataset, learner) not measured in this run, and a measured cell's scores on other seeds where it
was measured with the same settings, params.yaml's values included (so `--seeds 1` adds a seed to a cell of seed 0).
`--updates-scale` gives every learner more gradient updates than params.yaml (sized for the default pipeline's
CartPole data), ours and d3rlpy's alike; `--set FIELD=VALUE` gives the learners that have that hyper-parameter
another value on every dataset measured; a cell with `per_dataset` or `--set` values says so. `--d3rlpy-set
FIELD=VALUE` sets a field of d3rlpy's own config, to measure one of its defaults that ours lacks, or one of
d3rlpy_runner.py's own settings (its `PROBES`: `update_order`, `batch_draws`, `adam_eps`, `log_std_bounds`,
`temperature_loss`, `initial_weights`), which train d3rlpy's CQL as ours does in one respect each. `--initial-weights
FILE` starts our CQL from a file of weights by d3rlpy's names instead of its seed's draw: d3rlpy's draw, as
`d3rlpy_runner.py --save-initial-weights` writes it, or ours (`cql_one_update.py --save-weights`).
`--sample-actions` evaluates our policy learners (BC, MARWIL) sampling their actions, as a stochastic behaviour policy
acts, instead of greedily (d3rlpy's DiscreteBC cannot: its sample_action is argmax). `--train-seconds` stops our
learners at a time budget instead of params.yaml's iterations, for a machine lent for a fixed time
(benchmarks/gpu_lease/). `--keep-checkpoints DIR` keeps our trained policies there, and d3rlpy's CQL's trained weights,
to look into a score (benchmarks/critic_probe.py). `--pool DIR ...` measures nothing: it joins the cells of runs made
apart (one seed per process, two processes at once on 2 cores) into OUT's table, each cell with every run's seeds, and
refuses a cell whose runs differ in settings.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import yaml

import dataset_format as dataset
from collectors.config import PolicyConfig
from collectors.rollout import episode_seeds, rollout_returns
from common.errors import UserError, exit_on_user_error
from common.ray_runtime import start_ray
from evaluation.references import CEILING, no_score_reason, normalized_score, read_reference
from pipelines.params import load_params
from training.algorithms.registry import ALGORITHMS, learner_metrics, rllib_config
from training.config import CQLParams, DQNParams, IQLParams, LearnerParams

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as `python benchmarks/quality_table.py`: its siblings import as benchmarks.*
    sys.path.insert(0, str(ROOT))
SUITE = ROOT / "benchmarks" / "suite"  # the full suite's pipeline: its params, datasets and references

POLICY_ALGOS = [name for name, entry in ALGORITHMS.items() if entry.policy_is_distribution]

DISCRETE_ALGOS = ["bc", "marwil", "dqn", "cql_dqn", "iql"]
CONTINUOUS_ALGOS = ["bc", "marwil", "cql", "iql"]
# Our algorithm whose hyper-parameters d3rlpy's counterpart takes (d3rlpy has no discrete-action IQL).
D3RLPY_COUNTERPART = {"d3rlpy-bc": "bc", "d3rlpy-cql": "cql_dqn"}
D3RLPY_CONTINUOUS_COUNTERPART = {"d3rlpy-bc": "bc", "d3rlpy-cql": "cql", "d3rlpy-iql": "iql"}
COLUMNS = ["behaviour", *dict.fromkeys(DISCRETE_ALGOS + CONTINUOUS_ALGOS),
           *dict.fromkeys([*D3RLPY_COUNTERPART, *D3RLPY_CONTINUOUS_COUNTERPART])]


def train_ours(algo: str, params: LearnerParams, dataset_dir: Path, seed: int, checkpoint: Path,
               seconds: float | None = None,
               initial_weights: Path | None = None) -> tuple[int, list[dict[str, float]]]:
    """Trains for params' iterations, or until the first iteration that ends past `seconds`, from `initial_weights`
    where given (CQL's, `--initial-weights`); returns the gradient updates made and the learner's metrics at each
    progress line, where `on_path` says (a cell can take an hour), and at the last iteration. The metrics show a
    learner's path (CQL's learned weight) where a score alone cannot."""
    algorithm = rllib_config(algo, params, dataset_dir, seed).build_algo()
    started, path = time.monotonic(), []
    try:
        if initial_weights is not None:
            from benchmarks.cql_one_update import start_from

            start_from(algorithm, initial_weights)
        for iteration in range(1, params.iterations + 1):
            metrics = learner_metrics(algorithm.train())
            elapsed = time.monotonic() - started
            if on_path(iteration, params.iterations):
                path.append({"iteration": iteration, **metrics})
                print(f"[train {algo} {dataset_dir.name} seed {seed}] iteration {iteration}/{params.iterations} "
                      f"({elapsed:.0f}s, {iteration * params.updates_per_iteration * params.batch_size / elapsed:,.0f}"
                      " samples/s)", file=sys.stderr, flush=True)
            if seconds is not None and elapsed > seconds:
                break
        algorithm.save_to_path(checkpoint.resolve())
        if path[-1]["iteration"] != iteration:
            path.append({"iteration": iteration, **metrics})
        return iteration * params.updates_per_iteration, path
    finally:
        algorithm.stop()
        del algorithm
        gc.collect()


D3RLPY_PYTHON = ROOT / ".venv-d3rlpy" / "bin" / "python"  # `make .venv-d3rlpy/.installed`


def on_path(iteration: int, iterations: int) -> bool:
    """Whether a learner's metrics after `iteration` of `iterations` are kept: after the first (it loads the data),
    every tenth of them and the last."""
    return iteration in (1, iterations) or iteration % max(1, iterations // 10) == 0


def train_d3rlpy(python: str, algo: str, params: LearnerParams, dataset_dir: Path, seed: int,
                 eval_seeds: list[int], config: dict, save_weights: Path | None = None
                 ) -> tuple[np.ndarray, list[dict[str, float]]]:
    """The returns of `eval_seeds`' episodes, and d3rlpy's own metrics (an epoch of d3rlpy's is one of our
    iterations) where `on_path` keeps ours. `config`: d3rlpy config fields over its defaults (`--d3rlpy-set`);
    `save_weights`: where a continuous CQL writes the weights it trained."""
    command = [python, str(ROOT / "benchmarks" / "d3rlpy_runner.py"), "--dataset", str(dataset_dir),
               "--algo", algo.removeprefix("d3rlpy-"), "--seed", str(seed),
               "--steps", str(params.iterations * params.updates_per_iteration),
               "--epoch-updates", str(params.updates_per_iteration),
               "--batch-size", str(params.batch_size), "--lr", str(params.lr),
               "--hidden", *map(str, params.hidden_layers), "--conv-filters", json.dumps(params.conv_filters),
               "--eval-seeds", json.dumps(eval_seeds), "--config", json.dumps(config)]
    if isinstance(params, DQNParams):
        command += ["--gamma", str(params.gamma), "--target-update-every", str(params.target_update_every),
                    "--cql-alpha", str(params.cql_alpha)]
    if isinstance(params, CQLParams):
        command += ["--gamma", str(params.gamma), "--tau", str(params.tau), "--actor-lr", str(params.actor_lr),
                    "--cql-alpha", str(params.min_q_weight)]
        if save_weights is not None:
            command += ["--save-weights", str(save_weights)]
    if isinstance(params, IQLParams):
        command += ["--gamma", str(params.gamma), "--tau", str(params.tau), "--actor-lr", str(params.actor_lr),
                    "--expectile", str(params.expectile), "--beta", str(params.beta)]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode:
        raise UserError(f"{algo} on {dataset_dir} failed: "
                        f"{(run.stderr.strip().splitlines() or ['no output'])[-1]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    path = [{"iteration": epoch["epoch"], **{k: v for k, v in epoch.items() if k != "epoch"}}
            for epoch in result["metrics"] if on_path(epoch["epoch"], params.iterations)]
    return np.array(result["returns"]), path


def field_value(text: str) -> tuple[str, object]:
    """`--set`'s FIELD=VALUE, the value read as YAML (as params.yaml's are)."""
    field, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not FIELD=VALUE")
    return field, yaml.safe_load(value)


def markdown(results: dict, columns: list[str]) -> str:
    """The table; a cell trained with more updates than params.yaml's or another hyper-parameter value (`per_dataset`
    or `--set`), for a time budget, evaluated sampling its actions, or on more or fewer seeds than most cells, says
    so in parentheses."""
    lines = ["| env | dataset | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    seed_counts = [len(scores) for entry in results.values() for column, scores in entry["scores"].items()
                   if column != "behaviour"]
    usual_seeds = max(set(seed_counts), key=seed_counts.count, default=0)
    for name, entry in results.items():
        cells = []
        for column in columns:
            scores = entry["scores"].get(column)
            if scores is None:
                cells.append("")
                continue
            cells.append(f"{np.mean(scores):.1f}" + (f" ± {np.std(scores):.1f}" if len(scores) > 1 else ""))
            scale = entry.get("updates_scale", {}).get(column, 1)
            notes = ([f"×{scale}"] if scale != 1 else []) + [
                f"{field} {value}" for field, value in entry.get("overrides", {}).get(column, {}).items()] + (
                ["sampled"] if entry.get("sampled", {}).get(column) else []) + (
                [budget_note(entry, column)] if entry.get("train_seconds", {}).get(column) else []) + (
                [f"{len(scores)} seed{'s' * (len(scores) != 1)}"] if column != "behaviour" and len(scores) != usual_seeds
                else [])
            cells[-1] += f" ({', '.join(notes)})" if notes else ""
        lines.append(f"| {entry['env_id']} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def budget_note(entry: dict, column: str) -> str:
    """The updates a time-budgeted cell's seeds made (`--train-seconds`)."""
    made = entry["updates_made"][column].values()  # recorded with every seed our learners train
    updates = f"{min(made):,}" if min(made) == max(made) else f"{min(made):,}-{max(made):,}"
    return f"{updates} updates, a {entry['train_seconds'][column]:.0f}s budget"


def plot(results: dict, columns: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(names)), 4.5))
    width = 0.8 / len(columns)
    for i, column in enumerate(columns):
        scores = [results[n]["scores"].get(column) for n in names]
        means = [np.mean(s) if s else np.nan for s in scores]
        stds = [np.std(s) if s else 0.0 for s in scores]
        ax.bar([x + i * width for x in range(len(names))], means, width, yerr=stds, capsize=2, label=column)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names, fontsize=8, rotation=20)
    ax.axhline(100, linestyle="--", color="grey")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_ylabel("normalized score (0 random, 100 expert)")
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, ncol=len(columns), loc="lower center")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(SUITE / "params.yaml"))
    parser.add_argument("--datasets", nargs="+", help="dataset names (default: every dataset in params.yaml)")
    parser.add_argument("--datasets-dir", type=Path, default=SUITE / "datasets")
    parser.add_argument("--references", type=Path, default=SUITE / "references")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--d3rlpy-python", default=str(D3RLPY_PYTHON))
    parser.add_argument("--no-d3rlpy", action="store_true")
    parser.add_argument("--algos", nargs="+", help="the columns to measure, ours or d3rlpy's (e.g. bc cql d3rlpy-bc; "
                        "default: every learner for the action space)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--updates-scale", type=int, default=1,
                        help="every learner (ours and d3rlpy's) makes this many times params.yaml's gradient updates; "
                             "the table marks such cells")
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE", type=field_value,
                        help="a hyper-parameter's value for every measured learner that has it, instead of "
                             "params.yaml's (e.g. beta=0.1); the cells say so")
    parser.add_argument("--d3rlpy-set", nargs="+", default=[], metavar="FIELD=VALUE", type=field_value,
                        help="a field of d3rlpy's own config for d3rlpy's learners, over its default (e.g. "
                             "alpha_learning_rate=0), or a setting of d3rlpy_runner.py's own (its PROBES, e.g. "
                             "update_order=rllib); the cells say so")
    parser.add_argument("--train-seconds", type=float,
                        help="our learners stop after the first iteration that ends past this many seconds (a lent "
                             "machine's fixed time); each cell records the updates its seeds made")
    parser.add_argument("--initial-weights", type=Path, metavar="FILE",
                        help="our CQL starts from these weights, not its seed's draw: a file by d3rlpy's names, as "
                             "cql_one_update.py --save-weights writes ours and d3rlpy_runner.py --save-initial-weights "
                             "d3rlpy's (needs --algos naming cql and no other learner of ours); the cells say so")
    parser.add_argument("--update", action="store_true",
                        help="keep what OUT/quality.json holds and replace only the cells measured now")
    parser.add_argument("--sample-actions", action="store_true",
                        help=f"evaluate {' and '.join(POLICY_ALGOS)} sampling their actions instead of greedily "
                             "(needs --algos naming only those)")
    parser.add_argument("--keep-checkpoints", type=Path, metavar="DIR",
                        help="keep each policy of ours as DIR/DATASET-COLUMN-seedN, to look into its score, instead "
                             "of in a temporary directory, and d3rlpy's continuous CQL's weights as "
                             "DIR/DATASET-d3rlpy-cql-seedN.pt (critic_probe.py reads both)")
    parser.add_argument("--pool", nargs="+", type=Path, metavar="DIR",
                        help="measure nothing: pool the cells of earlier runs (their --out directories) into OUT, "
                             "each cell with every run's seeds (those of --algos alone, where given); with --update, "
                             "OUT's own cells first")
    args = parser.parse_args()
    if args.sample_actions and not (args.algos and set(args.algos) <= set(POLICY_ALGOS)):
        parser.error(f"--sample-actions needs --algos naming only {', '.join(POLICY_ALGOS)}: the Q-learners' "
                     "policy is the greedy one, and d3rlpy's DiscreteBC only acts greedily")
    if args.train_seconds is not None and not args.no_d3rlpy and (
            args.algos is None or any(column.startswith("d3rlpy") for column in args.algos)):
        parser.error("--train-seconds applies to our learners only: add --no-d3rlpy, or --algos without d3rlpy's")
    if args.initial_weights and [column for column in args.algos or [] if not column.startswith("d3rlpy")] != ["cql"]:
        parser.error("--initial-weights starts our CQL alone: add --algos naming cql and no other learner of ours")
    if args.initial_weights and not args.initial_weights.is_file():
        parser.error(f"--initial-weights: {args.initial_weights} is no file; write one with cql_one_update.py "
                     "--save-weights or d3rlpy_runner.py --save-initial-weights")

    params = load_params(args.params)
    measured = args.out / "quality.json"
    if args.pool:
        pooled = pool(read_tables(args.pool), args.algos)
        if args.update and measured.exists():  # OUT's own cells, every column of them
            pooled = pool({**read_tables([args.out]), "the runs pooled": pooled})
        args.out.mkdir(parents=True, exist_ok=True)
        print(write_results(pooled, list(params.all_datasets), args.out))
        return
    counterpart = {**D3RLPY_COUNTERPART, **D3RLPY_CONTINUOUS_COUNTERPART}
    for field, _ in args.set:
        if not any(hasattr(params.algos.get(counterpart.get(column, column)), field)
                   for column in args.algos or params.algos.names()):
            parser.error(f"--set {field}: no learner measured has that hyper-parameter (training/config.py)")
    start_ray(params.ray.num_cpus)
    for folder in (args.out, args.keep_checkpoints):
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
    results = json.loads(measured.read_text()) if args.update and measured.exists() else {}  # none yet: a new table
    eval_seeds = [episode_seeds(params.evaluate.seed, i)[0] for i in range(params.evaluate.episodes)]
    for name in args.datasets or list(params.all_datasets):
        dataset_dir = args.datasets_dir / name
        card = dataset.read_card(dataset_dir)
        if card.env is None:
            raise UserError(f"{name} has no simulator to evaluate its learners on; leave it out of --datasets")
        try:
            reference = read_reference(args.references, card.env.label, params.evaluate)
        except UserError:  # not measured by the pipeline yet: measure it here, on the same seeds
            from evaluation.evaluate import measure_references  # it imports MLflow, which a lent GPU machine lacks

            measure_references([card.env], params.references, params.evaluate, args.references)
            reference = read_reference(args.references, card.env.label, params.evaluate)
        if CEILING not in reference:
            raise UserError(f"{name}: {no_score_reason(card.env.label)}; the quality table compares normalized scores")
        discrete = isinstance(card.spaces[1], gym.spaces.Discrete)
        entry = results[name] = {**results.get(name, {}), "env_id": card.env_id, "reference": reference}
        entry["scores"] = {**entry.get("scores", {}),
                           "behaviour": [normalized_score(card.returns["mean"], reference)]}
        table = write_results(results, list(params.all_datasets), args.out)  # the behaviour's row, before any learner
        learners = [(a, a) for a in (DISCRETE_ALGOS if discrete else CONTINUOUS_ALGOS)]
        if not args.no_d3rlpy:
            learners += list((D3RLPY_COUNTERPART if discrete else D3RLPY_CONTINUOUS_COUNTERPART).items())
        learners = [(column, ours) for column, ours in learners if not args.algos or column in args.algos]
        for column, ours in learners:
            configured = params.algos.get(ours)
            overrides = {**configured.per_dataset.get(name, {}),
                         **{field: value for field, value in args.set if hasattr(configured, field)}}
            base = dataclasses.replace(configured.for_dataset(name), **overrides)
            algo_params = dataclasses.replace(base, iterations=base.iterations * args.updates_scale)
            d3rlpy_config = dict(args.d3rlpy_set) if column.startswith("d3rlpy") else {}
            initial_weights = args.initial_weights if column == "cql" else None
            overrides = {**overrides, **d3rlpy_config,
                         **({"initial_weights": str(initial_weights)} if initial_weights else {})}
            settings = dataclasses.asdict(CellSettings(overrides, args.updates_scale, args.sample_actions,
                                                       args.train_seconds, algo_params.hyper_parameters()))
            scores = kept_scores(entry, column, settings)
            entry.setdefault("episode_returns", {})[column] = kept_episode_returns(entry, column, scores)
            for key, value in settings.items():
                entry.setdefault(key, {})[column] = value
            record(entry, column, scores)
            for seed in args.seeds:
                started = time.monotonic()
                if column.startswith("d3rlpy"):
                    weights = (args.keep_checkpoints / f"{name}-{column}-seed{seed}.pt"
                               if args.keep_checkpoints and isinstance(algo_params, CQLParams) else None)
                    returns, path = train_d3rlpy(args.d3rlpy_python, column, algo_params, dataset_dir, seed,
                                                 eval_seeds, d3rlpy_config, weights)
                else:
                    with (contextlib.nullcontext(args.keep_checkpoints) if args.keep_checkpoints
                          else tempfile.TemporaryDirectory()) as folder:
                        checkpoint = Path(folder) / f"{name}-{column}-seed{seed}"
                        updates, path = train_ours(column, algo_params, dataset_dir, seed, checkpoint,
                                                   args.train_seconds, initial_weights)
                        entry.setdefault("updates_made", {}).setdefault(column, {})[str(seed)] = updates
                        policy = PolicyConfig(kind="model", model=str(checkpoint), greedy=not args.sample_actions)
                        returns = rollout_returns(card.env, policy, params.evaluate.seed, params.evaluate.episodes,
                                                  params.evaluate.num_workers, label=f"evaluate {column} {name}").returns
                entry.setdefault("learner_metrics", {}).setdefault(column, {})[str(seed)] = path
                score = scores[seed] = normalized_score(float(np.mean(returns)), reference)
                entry["episode_returns"][column][str(seed)] = [round(float(value), 2) for value in returns]
                record(entry, column, scores)
                print(f"[quality] {name} {column} seed {seed}: return {np.mean(returns):.1f} (episodes "
                      f"{np.min(returns):.1f} to {np.max(returns):.1f}), normalized {score:.1f} "
                      f"({time.monotonic() - started:.0f}s)", file=sys.stderr, flush=True)
                table = write_results(results, list(params.all_datasets), args.out)  # a stopped run keeps its cells
    print(table)


def kept_scores(entry: dict, column: str, settings: dict) -> dict[int, float]:
    """The scores by training seed a cell already holds where it was measured with the same `settings` (the
    entry's per-column overrides, updates scale, sampling and resolved hyper-parameters), else none: a cell's seeds
    share its settings."""
    same = all(entry.get(key, {}).get(column) == json.loads(json.dumps(value)) for key, value in settings.items())
    if not same or column not in entry.get("seeds", {}):
        return {}
    return dict(zip(entry["seeds"][column], entry["scores"][column]))


def kept_episode_returns(entry: dict, column: str, kept: dict[int, float]) -> dict[str, list[float]]:
    """The evaluation episodes' returns of the seeds `kept_scores` kept, by seed: a mean hides the one episode of
    ten in which a walker's clone fell."""
    return {seed: returns for seed, returns in entry.get("episode_returns", {}).get(column, {}).items()
            if int(seed) in kept}


def record(entry: dict, column: str, scores: dict[int, float]) -> None:
    """A cell's scores and their training seeds, in the seeds' order; no cell until a seed is measured."""
    if scores:
        entry.setdefault("seeds", {})[column], entry["scores"][column] = map(list, zip(*sorted(scores.items())))
    else:
        entry["scores"].pop(column, None)
        entry.get("seeds", {}).pop(column, None)


@dataclasses.dataclass(frozen=True)
class CellSettings:
    """What a cell's seeds were measured with, kept in `quality.json` under each field's name, by column: seeds join
    one cell only where all of these are equal."""

    overrides: dict
    """The values set for this cell on top of params.yaml's: its per-dataset ones, --set, and d3rlpy's --d3rlpy-set."""
    updates_scale: int
    """--updates-scale: the iterations multiplied."""
    sampled: bool
    """--sample-actions: evaluated sampling the policy's actions, not greedily."""
    train_seconds: float | None
    """--train-seconds: each seed's training budget in seconds, where one was set."""
    hyper_parameters: dict
    """The learner's hyper-parameters as trained, params.yaml's included: a cell measured before a change to
    params.yaml is not pooled with one measured after it."""


CELL_SETTINGS = [field.name for field in dataclasses.fields(CellSettings)]
PER_SEED = ("episode_returns", "updates_made", "learner_metrics")  # a cell's records, by training seed


def pool(tables: dict[str, dict], columns: list[str] | None = None) -> dict:
    """One table of several runs' `quality.json` (`tables`, by where each was read), each cell with the seeds of every
    run that measured it (those of `columns` alone, where given): runs of one cell's seeds at once, in separate
    processes. A cell pools only runs that measured it with the same settings, and a dataset only runs that saw the
    same behaviour and references; a seed measured twice is an error, not a choice."""
    pooled: dict[str, dict] = {}
    for source, results in tables.items():
        for name, entry in results.items():
            into = pooled.setdefault(name, {"env_id": entry["env_id"], "reference": entry["reference"],
                                            "scores": {"behaviour": entry["scores"]["behaviour"]}})
            if _measured_on(into) != _measured_on(entry):
                raise UserError(f"{source}: {name} was measured on other data or references than in the runs "
                                "before it (its env, references or behaviour score differ); pool runs of one dataset")
            for column in entry["scores"]:
                if column == "behaviour" or (columns and column not in columns):
                    continue
                settings = {key: entry.get(key, {}).get(column) for key in CELL_SETTINGS}
                scores = dict(zip(entry["seeds"][column], entry["scores"][column]))
                if column in into.get("seeds", {}):
                    differ = setting_differences({key: into[key][column] for key in CELL_SETTINGS}, settings)
                    if differ:
                        raise UserError(f"{source}: {name}'s {column} was measured with other settings than the runs "
                                        f"before it ({'; '.join(differ)}); a cell's seeds share its settings")
                    twice = sorted(set(into["seeds"][column]) & set(scores))
                    if twice:
                        raise UserError(f"{source}: {name}'s {column} seed {twice[0]} is in an earlier run too; "
                                        "leave one of them out")
                    scores |= dict(zip(into["seeds"][column], into["scores"][column]))
                for key in CELL_SETTINGS:
                    into.setdefault(key, {})[column] = settings[key]
                for key in PER_SEED:
                    if column in entry.get(key, {}):
                        into.setdefault(key, {}).setdefault(column, {}).update(entry[key][column])
                record(into, column, scores)
    return pooled


# How a setting's field one run lacks reads in `setting_differences`.
ABSENT = "absent"


def setting_differences(before: dict, now: dict) -> list[str]:
    """How a cell's settings `now` differ from `before`, each as "SETTING: NOW against BEFORE", field by field in the
    settings that are dicts (a field one lacks, such as a hyper-parameter added since, is "absent")."""
    differences = []
    for key in CELL_SETTINGS:
        old, new = before[key], now[key]
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            fields = sorted(field for field in old.keys() | new.keys()
                            if old.get(field, ABSENT) != new.get(field, ABSENT))
            differences.append(f"{key}: " + ", ".join(f"{field} {new.get(field, ABSENT)} against "
                                                      f"{old.get(field, ABSENT)}" for field in fields))
        else:
            differences.append(f"{key}: {new} against {old}")
    return differences


def read_tables(directories: list[Path]) -> dict[str, dict]:
    """The tables of earlier runs, by path: each directory's `quality.json`."""
    tables = {}
    for directory in directories:
        path = directory / "quality.json"
        try:
            tables[str(path)] = json.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"{path} does not exist; --pool takes the --out directories of earlier runs") from None
        except json.JSONDecodeError as err:
            raise UserError(f"{path} is not a quality table's JSON ({err}); pool the --out directories of runs of "
                            "this script") from None
    return tables


def _measured_on(entry: dict) -> tuple:
    return entry["env_id"], entry["reference"], entry["scores"]["behaviour"]


def write_results(results: dict, order: list[str], out: Path) -> str:
    """OUT/quality.{md,json,png}, rows in params.yaml's order; returns the table."""
    results = {n: results[n] for n in dict.fromkeys([*order, *results]) if n in results}
    columns = [c for c in COLUMNS if any(c in entry["scores"] for entry in results.values())]
    table = markdown(results, columns)
    (out / "quality.md").write_text(table)
    (out / "quality.json").write_text(json.dumps(results, indent=2))
    plot(results, columns, out / "quality.png")
    return table


if __name__ == "__main__":
    exit_on_user_error(main)
