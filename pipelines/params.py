"""params.yaml, parsed once into typed dataclasses, with one-line errors that name the bad key."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from collectors.config import CollectConfig, DatasetConfig
from common.checks import require_positive
from common.envs import EnvSpec
from common.errors import UserError
from common.trained_policy import is_mlflow_uri
from evaluation.config import EvaluateConfig, OPEConfig, ReferenceConfig
from interop.config import ImportConfig
from training.config import AlgosConfig, OnlinePolicyConfig, TrainConfig


@dataclass(frozen=True)
class RayConfig:
    """Resources of the local Ray instance (ignored when RAY_ADDRESS points at a cluster)."""

    num_cpus: int = 2
    """Logical CPUs Ray may schedule on; defaults to this 2-core machine's size."""

    def __post_init__(self):
        require_positive(self, "num_cpus")


@dataclass(frozen=True)
class Params:
    """All of params.yaml."""

    datasets: dict[str, DatasetConfig]
    """Datasets to collect, by name; each becomes datasets/NAME."""
    policy_datasets: dict[str, DatasetConfig] = field(default_factory=dict)
    """Datasets collected with a policy this pipeline trains (`policy.model`: a `runs/.../checkpoint`), by
    name; each becomes datasets/NAME once that run exists (dvc.yaml's collect_from_policy stage)."""
    online_policies: dict[str, OnlinePolicyConfig] = field(default_factory=dict)
    """Behaviour policies trained online (PPO) up to a target score, by name; each becomes runs/ppo-NAME, which
    `policy_datasets` may collect with, and datasets/NAME-replay, every episode it trained on (dvc.yaml's
    train_online stage)."""
    imports: dict[str, ImportConfig] = field(default_factory=dict)
    """Data made elsewhere (Minari datasets, logs in CSV or Parquet), by name; each becomes datasets/NAME
    (dvc.yaml's import stage)."""
    ray: RayConfig = field(default_factory=RayConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algos: AlgosConfig = field(default_factory=AlgosConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    ope: OPEConfig = field(default_factory=OPEConfig)
    references: dict[str, ReferenceConfig] = field(default_factory=dict)
    """The normalized score's floor and ceiling, by environment name (an id, or a spec's `name`); an env left out
    scores from a random floor and has no ceiling, so its results are raw returns."""

    def __post_init__(self):
        for name, spec in self.policy_datasets.items():
            if name in self.datasets:
                raise ValueError(f"policy_datasets.{name} is also under `datasets`; give it another name")
            if spec.policy.kind != "model" or is_mlflow_uri(spec.policy.model):
                raise ValueError(f"policy_datasets.{name}.policy must be kind 'model' with a checkpoint directory "
                                 "that the pipeline trains (e.g. runs/ALGO-DATASET/checkpoint)")
        for name in self.imports:
            if name in self.all_datasets:
                raise ValueError(f"imports.{name} is also a collected dataset's name; give it another name")
        for name in self.replay_datasets:
            if name in self.all_datasets or name in self.imports:
                raise ValueError(f"{name} is the replay of online_policies.{name.removesuffix('-replay')} and "
                                 "another dataset's name; rename one")
        for where, names in [*((f"train.runs.{name}.dataset", [run.dataset]) for name, run in self.train.runs.items()),
                             *((f"algos.{algo}.per_dataset", self.algos.get(algo).per_dataset)
                               for algo in self.algos.names())]:
            missing = [d for d in names if d not in {*self.all_datasets, *self.imports, *self.replay_datasets}]
            if missing:
                raise ValueError(f"{where} names {missing}, which are not under `datasets`, `policy_datasets` or "
                                 "`imports`, nor an online policy's replay (NAME-replay)")

    @property
    def all_datasets(self) -> dict[str, DatasetConfig]:
        return {**self.datasets, **self.policy_datasets}

    @property
    def replay_datasets(self) -> list[str]:
        """The datasets `orl train-online` writes: NAME-replay for each online policy."""
        return [f"{name}-replay" for name in self.online_policies]

    def online_policy(self, name: str) -> OnlinePolicyConfig:
        if name not in self.online_policies:
            raise UserError(f"no online policy '{name}' in params.yaml: known are {', '.join(self.online_policies)}")
        return self.online_policies[name]

    @property
    def simulated_envs(self) -> list[EnvSpec]:
        """Every environment whose policies the pipeline evaluates (`orl reference` measures them), once each."""
        envs = [d.env for d in self.all_datasets.values()] + [p.env for p in self.online_policies.values()] + [
            i.env for i in self.imports.values() if i.env]
        return list({env.label: env for env in envs}.values())

    def imported(self, name: str) -> ImportConfig:
        if name not in self.imports:
            raise UserError(f"no import '{name}' in params.yaml: known are {', '.join(self.imports) or 'none'}")
        return self.imports[name]

    def dataset(self, name: str) -> DatasetConfig:
        if name not in self.all_datasets:
            raise UserError(f"no dataset '{name}' in params.yaml: known are {', '.join(self.all_datasets)}")
        return self.all_datasets[name]


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} not found; run from the project root or pass --params") from None
    except yaml.YAMLError as err:
        raise UserError(f"{path} is not valid YAML ({str(err).splitlines()[0]})") from None
    return _build(Params, data or {}, str(path), "")


def _build(cls, data, source: str, where: str):
    if not isinstance(data, dict):
        raise UserError(f"{source}: {where or 'the file'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    # A field's key is its name, or the one its metadata gives (`import`, a Python keyword).
    names = {f.metadata.get("key", f.name): f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise UserError(f"{source}: unknown key '{_join(where, key)}'; known keys: {', '.join(names)}")
    kwargs = {names[key]: _coerce(hints[names[key]], value, source, _join(where, key)) for key, value in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as err:  # a required field is missing
        raise UserError(f"{source}: {where or 'top level'}: {err}") from None
    except ValueError as err:
        raise UserError(f"{source}: {where or 'top level'}: {err}") from None


def _coerce(tp, value, source: str, where: str):
    if tp is typing.Any:  # checked by the dataclass that holds it (`per_dataset`)
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):  # `X | None`: a section that may be left out
        if value is None:
            return None
        (tp,) = [arg for arg in args if arg is not type(None)]
        return _coerce(tp, value, source, where)
    if tp is EnvSpec and isinstance(value, str):  # the short form: a registered id
        value = {"id": value}
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, source, where)
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{source}: {where} must be a mapping, got {value!r}")
        return {str(k): _coerce(args[1], v, source, f"{where}.{k}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"{source}: {where} must be a list, got {value!r}")
        return [_coerce(args[0], v, source, f"{where}[{i}]") for i, v in enumerate(value)]
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[tp]
    if not ok:
        raise UserError(f"{source}: {where} must be a {tp.__name__}, got {value!r}")
    return tp(value)


def _join(where: str, key) -> str:
    return f"{where}.{key}" if where else str(key)
