"""`orl`: the command every dvc.yaml stage and every user action goes through.

Each subcommand parses params.yaml once, starts Ray where it needs it, and calls one function that does the
work (collectors.collect.collect, training.train.train, training.online.train_online, evaluation.evaluate.*,
evaluation.ope.*, evaluation.report.report, dataset_format for `orl datasets`, interop for
`orl datasets import|export`). `orl repro` runs `dvc repro` with every stage on one Ray.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path

from common.errors import UserError, user_error_behind
from common.ray_runtime import exit_on_sigterm, quiet_library_notices, start_ray
from evaluation.config import ESTIMATORS, SELECT_BY
from pipelines.params import Params, load_params
from pipelines.warm import forward, warm_server
from training.config import AlgosConfig


def cmd_collect(args, params: Params) -> None:
    from collectors.collect import Collection

    collection = Collection.plan(args.name, params.dataset(args.name), params.collect,
                                 args.out or Path("datasets") / args.name)  # bad input fails before Ray starts
    start_ray(params.ray.num_cpus)
    collection.run()


def cmd_train(args, params: Params) -> None:
    from dataset_format import locate
    from tracking import connect
    from training.plan import plan_training

    location = locate(args.dataset)  # located once, then handed down
    name = location.name
    try:
        configured = params.algos.get(args.algo)
    except ValueError as err:
        raise UserError(str(err)) from None
    if name in configured.per_dataset:
        values = ", ".join(f"{key}={value}" for key, value in configured.per_dataset[name].items())
        print(f"[train] {args.algo} on {name} with algos.{args.algo}.per_dataset's {values}", flush=True)
    seed = params.train.seed if args.seed is None else args.seed
    plan = plan_training(args.algo, configured.for_dataset(name), location,
                         args.out or Path("runs") / f"{args.algo}-{name}", seed)
    connect()  # an unreachable tracking server fails now, before Ray starts
    from training.train import train  # RLlib and torch: seconds, spent once the input is known to be good

    start_ray(params.ray.num_cpus)
    train(plan, params.train.checkpoint_every)


def cmd_train_online(args, params: Params) -> None:
    from tracking import connect
    from training.online import train_online

    config = params.online_policy(args.name)
    connect()
    start_ray(params.ray.num_cpus)
    train_online(args.name, config, args.references, params.evaluate, args.out or Path("runs") / f"ppo-{args.name}",
                 args.replay_out or Path("datasets") / f"{args.name}-replay", int(params.collect.file_mib * 2**20))


def _start_episode_runners(params: Params) -> None:
    """Ray for the evaluation episodes' actors; none where `evaluate.num_workers` is 0 (they run in this process)."""
    if params.evaluate.num_workers:
        start_ray(params.ray.num_cpus)


def cmd_reference(args, params: Params) -> None:
    from evaluation.evaluate import measure_references

    _start_episode_runners(params)
    measure_references(params.simulated_envs, params.references, params.evaluate, args.out)


def cmd_evaluate(args, params: Params) -> None:
    from evaluation.evaluate import evaluate

    _start_episode_runners(params)
    evaluate(args.run_dir, args.references, params.evaluate)


def positive_float(text: str) -> float:
    """An argument that must be a number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def cmd_ope(args, params: Params) -> None:
    from evaluation.ope import ope

    ope(args.run_dir, args.dataset, args.references, params.ope, params.evaluate, args.estimators, args.temperature)


def cmd_select(args, params: None) -> None:
    from evaluation.ope import select

    select(args.dataset, args.by)


def cmd_report(args, params: Params) -> None:
    from evaluation.report import report

    print(report(args.runs, args.references, args.out))


def cmd_datasets_list(args, params: None) -> None:
    from dataset_format import CARD_FILE, locate, read_card

    for location in locate(args.root).children():
        if not location.is_file(CARD_FILE):
            continue
        card = read_card(location)
        print(f"{location!s:40} {card.env_id or '(no env)':15} {card.behavior_policy['kind']:8} "
              f"{card.episodes:6} episodes {card.transitions:9} transitions  return {card.returns['mean']:8.1f}")


def cmd_datasets_show(args, params: None) -> None:
    from dataset_format import validate

    card = validate(args.path)
    print(card.to_json(), end="")
    print(f"# {args.path}: valid ({len(card.files)} files)", file=sys.stderr)


def cmd_datasets_validate(args, params: None) -> None:
    from common.envs import env_spaces
    from dataset_format import read_card, validate

    for path in args.paths:
        env = read_card(path).env
        card = validate(path, env_spaces(env) if env else None)  # the card's spaces must be the env's too
        print(f"{path}: valid ({card.episodes} episodes, {card.transitions} transitions, {len(card.files)} files)")


def cmd_datasets_import(args, params: Params) -> None:
    from interop.importing import import_dataset

    import_dataset(args.name, params.imported(args.name), args.out or Path("datasets") / args.name,
                   file_bytes=int(params.collect.file_mib * 2**20))


def cmd_datasets_export(args, params: None) -> None:
    from interop.minari_io import export_minari

    export_minari(args.path, args.id)


def cmd_repro(args, params: Params) -> None:
    import ray

    start_ray(params.ray.num_cpus)  # the cluster of RAY_ADDRESS, checked before any stage runs; or a local Ray
    # Every stage's `orl` connects to it instead of starting and stopping a Ray of its own (seconds per stage).
    os.environ["RAY_ADDRESS"] = os.environ.get("RAY_ADDRESS") or ray.get_runtime_context().gcs_address
    with warm_orl() as warm:  # and every stage's `orl` forks from one process that has done its imports
        dvc = subprocess.run([sys.executable, "-m", "dvc", "repro", *args.targets, *args.dvc_flags],
                             env={**os.environ, **warm})
    if dvc.returncode:
        sys.exit(dvc.returncode)  # DVC said what failed


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="orl", description="Offline RL pipeline: collect, train, evaluate, report.")
    top.add_argument("--params", default="params.yaml", help="parameters file (default: params.yaml)")
    top.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("repro", help="dvc repro, every stage on one Ray (RAY_ADDRESS's cluster or one started here)")
    p.add_argument("targets", nargs="*", help="stages to reproduce; these and dvc repro's flags (-f, -s, ...) are "
                   "passed on to it")
    p.set_defaults(handler=cmd_repro)

    p = sub.add_parser("collect", help="collect one dataset named in params.yaml")
    p.add_argument("name", help="key under `datasets` or `policy_datasets` in params.yaml")
    p.add_argument("--out", help="dataset directory or s3://BUCKET/PREFIX (default: datasets/NAME)")
    p.set_defaults(handler=cmd_collect)

    p = sub.add_parser("train", help="train one algorithm offline on one dataset")
    p.add_argument("--algo", required=True,
                   help=f"{', '.join(AlgosConfig.names())} (hyper-parameters under `algos` in params.yaml)")
    p.add_argument("--dataset", required=True, help="dataset directory or s3://BUCKET/PREFIX")
    p.add_argument("--out", type=Path, help="run directory (default: runs/ALGO-DATASET)")
    p.add_argument("--seed", type=int, help="overrides train.seed")
    p.set_defaults(handler=cmd_train)

    p = sub.add_parser("train-online", help="train a behaviour policy online (PPO) up to a target score")
    p.add_argument("name", help="key under `online_policies` in params.yaml")
    p.add_argument("--references", type=Path, default=Path("references"))
    p.add_argument("--out", type=Path, help="run directory (default: runs/ppo-NAME)")
    p.add_argument("--replay-out", type=Path, help="dataset of the episodes PPO trained on (default: "
                   "datasets/NAME-replay)")
    p.set_defaults(handler=cmd_train_online)

    p = sub.add_parser("reference", help="measure random and expert returns on the evaluation seeds")
    p.add_argument("--out", type=Path, default=Path("references"))
    p.set_defaults(handler=cmd_reference)

    p = sub.add_parser("evaluate", help="evaluate a trained policy in its environment")
    p.add_argument("run_dir", type=Path, help="run directory written by `orl train`")
    p.add_argument("--references", type=Path, default=Path("references"))
    p.set_defaults(handler=cmd_evaluate)

    p = sub.add_parser("ope", help="estimate a trained policy's return from a dataset alone (off-policy evaluation)")
    p.add_argument("run_dir", type=Path, help="run directory written by `orl train`")
    p.add_argument("--dataset", required=True, help="dataset directory or s3://BUCKET/PREFIX of the run's env")
    p.add_argument("--references", type=Path, default=Path("references"))
    p.add_argument("--estimators", nargs="+", choices=ESTIMATORS,
                   help="default: every estimator that applies (the others are recorded as undefined, with why)")
    p.add_argument("--temperature", type=positive_float,
                   help="estimate a softmax version of the policy instead, sampling from softmax(logits / T) over "
                        "Discrete actions (the Q-values of DQN and CQL as logits); orl select passes over it")
    p.set_defaults(handler=cmd_ope)

    p = sub.add_parser("select", help="point the registry alias DATASET-ope-best at the best run by an estimate")
    p.add_argument("--dataset", required=True, help="the name of the dataset the runs were trained on")
    p.add_argument("--by", nargs="+", choices=ESTIMATORS,
                   help="the estimators (MLflow metrics ope/NAME); with several, a run is picked only where all of "
                        f"them put it above the behaviour policy (default: {' and '.join(SELECT_BY)}, of them those "
                        "run on the dataset; docs/ope.md)")
    p.set_defaults(handler=cmd_select, reads_params=False)

    p = sub.add_parser("report", help="one table and plots across all evaluated runs")
    p.add_argument("--runs", type=Path, default=Path("runs"))
    p.add_argument("--references", type=Path, default=Path("references"))
    p.add_argument("--out", type=Path, default=Path("reports"))
    p.set_defaults(handler=cmd_report)

    p = sub.add_parser("datasets", help="inspect datasets")
    datasets = p.add_subparsers(dest="action", required=True)
    q = datasets.add_parser("list", help="one line per dataset")
    q.add_argument("root", nargs="?", default="datasets", help="a directory or s3://BUCKET/PREFIX of datasets")
    q.set_defaults(handler=cmd_datasets_list, reads_params=False)
    q = datasets.add_parser("show", help="validate a dataset and print its card")
    q.add_argument("path", help="a dataset directory or s3://BUCKET/PREFIX")
    q.set_defaults(handler=cmd_datasets_show, reads_params=False)
    q = datasets.add_parser("validate", help="run every check collect and train run on datasets")
    q.add_argument("paths", nargs="+", help="dataset directories or s3://BUCKET/PREFIX URIs")
    q.set_defaults(handler=cmd_datasets_validate, reads_params=False)
    q = datasets.add_parser("import", help="import a Minari dataset or a CSV/Parquet log named in params.yaml")
    q.add_argument("name", help="key under `imports` in params.yaml")
    q.add_argument("--out", help="dataset directory or s3://BUCKET/PREFIX (default: datasets/NAME)")
    q.set_defaults(handler=cmd_datasets_import)
    q = datasets.add_parser("export", help="write a dataset to the local Minari store")
    q.add_argument("path", help="a dataset directory or s3://BUCKET/PREFIX")
    q.add_argument("--to", choices=["minari"], required=True, help="the format to write (minari)")
    q.add_argument("--id", required=True, help="the Minari dataset id, NAMESPACE/NAME-v0 "
                   "(stored under MINARI_DATASETS_PATH, default ~/.minari/datasets)")
    q.set_defaults(handler=cmd_datasets_export, reads_params=False)
    return top


def main(argv: list[str] | None = None) -> int:
    status = forward(sys.argv if argv is None else [sys.argv[0], *argv])  # to a warm `orl`, where one is named
    if status is not None:
        return status
    quiet_library_notices()  # also those of checks before Ray starts (RLlib's, on loading a behaviour policy)
    top = parser()
    args, unknown = top.parse_known_args(argv)
    if args.command == "repro":
        args.dvc_flags = unknown  # every `dvc repro` option is a flag: they pass on whatever their order
    elif unknown:
        top.error(f"unrecognized arguments: {' '.join(unknown)}")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    exit_on_sigterm()
    try:
        # Commands that only read or write a dataset work anywhere, without params.yaml.
        args.handler(args, load_params(args.params) if getattr(args, "reads_params", True) else None)
    except Exception as err:
        user_error = user_error_behind(err)
        if user_error is None or args.debug:
            raise
        print(f"orl: error: {user_error}", file=sys.stderr)
        return 2
    return 0


def warm_orl() -> AbstractContextManager[dict[str, str]]:
    """A warm `orl` (pipelines/warm.py) while in the context; it yields the variables that send `orl` to it."""
    return warm_server("pipelines.cli:main", "pipelines.cli:import_what_commands_need")


def import_what_commands_need() -> None:
    """What the subcommands import when they run, imported ahead for a warm `orl`. Nothing may start here."""
    import torch

    import collectors.collect  # noqa: F401
    import evaluation.evaluate  # noqa: F401
    import evaluation.ope  # noqa: F401
    import evaluation.report  # noqa: F401
    import interop  # noqa: F401
    import tracking  # noqa: F401
    import training.online  # noqa: F401
    import training.train  # noqa: F401

    # RLlib seeds torch through this call, whose first use imports torch's compiler configuration (seconds); the
    # same mode again changes nothing.
    torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled(),
                                       warn_only=torch.is_deterministic_algorithms_warn_only_enabled())


if __name__ == "__main__":
    sys.exit(main())
