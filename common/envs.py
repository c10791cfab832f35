"""Environments: any Gymnasium environment, described by an `EnvSpec` and made by `make_env`, the one function
every stage (collection, evaluation, references, OPE, Minari export) recreates an environment through.

A spec is what params.yaml's `env:` says and what a dataset's card records: a registered id (`CartPole-v1`,
`ALE/Pong-v5` once ale-py is imported) or a mapping with an entry point, kwargs, modules to import first,
wrappers and a time limit (docs/environments.md).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import gymnasium as gym
import gymnasium.wrappers

from common.errors import UserError, first_line


@dataclass(frozen=True)
class EnvSpec:
    """How to make an environment. Give `id` or `entry_point`."""

    id: str = ""
    """A Gymnasium id: registered by gymnasium, or by a module in `imports` (ale_py registers `ALE/...`)."""
    entry_point: str = ""
    """Instead of `id`: the environment class (or a function making it), as `package.module:Name`."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment's constructor."""
    imports: list[str] = field(default_factory=list, metadata={"key": "import"})
    """Modules imported before making it (params.yaml's key is `import`): those that register ids on import."""
    wrappers: list[Any] = field(default_factory=list)
    """Wrappers applied in order, each a name (`FlattenObservation`) or a one-key mapping of name to kwargs
    (`{AtariPreprocessing: {frame_skip: 1}}`); a name is one of `gymnasium.wrappers`, or `package.module:Name`."""
    max_episode_steps: int | None = None
    """The time limit; None: the registered one (an entry point then has none)."""
    name: str = ""
    """What MLflow experiments, registered models and references are named after; defaults to the id, or the
    entry point's class name."""

    def __post_init__(self):
        if bool(self.id) == bool(self.entry_point):
            raise ValueError("an env spec gives either `id` (a registered Gymnasium id) or `entry_point` "
                             "(package.module:Class), not both or neither")
        if self.entry_point and ":" not in self.entry_point:
            raise ValueError(f"entry_point '{self.entry_point}' must read package.module:Name")
        for wrapper in self.wrappers:
            if not (isinstance(wrapper, str) or (isinstance(wrapper, dict) and len(wrapper) == 1
                                                 and isinstance(next(iter(wrapper.values())), dict | None))):
                raise ValueError(f"wrapper {wrapper!r} must be a name or a one-key mapping of name to kwargs")
        if self.max_episode_steps is not None and self.max_episode_steps <= 0:
            raise ValueError(f"max_episode_steps {self.max_episode_steps} must be positive")

    @property
    def is_plain_id(self) -> bool:
        """Whether the spec is a registered id and nothing more, as `gym.make(id)` makes it."""
        return self.to_dict() == {"id": self.id}

    @property
    def label(self) -> str:
        """The environment's name for people and file names."""
        return self.name or self.id or self.entry_point.rsplit(":", 1)[1]

    def to_dict(self) -> dict:
        """The spec as a card records it: only the keys that were given, with `import` spelled as in params.yaml."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if value != default:
                out[f.metadata.get("key", f.name)] = value
        return out

    @classmethod
    def of(cls, value: str | EnvSpec) -> EnvSpec:
        """A spec, given as one or in its short form, a registered id."""
        return cls(id=value) if isinstance(value, str) else value

    @classmethod
    def from_dict(cls, data: dict) -> EnvSpec:
        """The spec a card or run records (`to_dict`'s form)."""
        names = {f.metadata.get("key", f.name): f.name for f in dataclasses.fields(cls)}
        return cls(**{names[k]: v for k, v in data.items()})

    @classmethod
    def recorded(cls, env_id: str | None, env_spec: dict | None) -> EnvSpec | None:
        """The spec a card or run.json records; those written before specs existed name only a registered id."""
        if env_spec:
            return cls.from_dict(env_spec)
        return cls(id=env_id) if env_id else None

    def _import_modules(self) -> None:
        for module in self.imports:
            _import(module, f"env {self.label}: import '{module}'")


def make_env(spec: EnvSpec | str) -> gym.Env:
    """The environment a spec (or a registered id) describes, with its time limit and wrappers; bad specs are
    one-line errors."""
    spec = EnvSpec.of(spec)
    spec._import_modules()
    _quiet_native_banners()
    limit = {"max_episode_steps": spec.max_episode_steps} if spec.max_episode_steps else {}
    try:
        if spec.id:
            _registered(spec.id)
            env = gym.make(spec.id, **limit, **spec.kwargs)
        else:
            _import(spec.entry_point.split(":")[0], f"env {spec.label}: entry_point '{spec.entry_point}'")
            env = gym.make(gym.envs.registration.EnvSpec(id=spec.label, entry_point=spec.entry_point,
                                                         max_episode_steps=spec.max_episode_steps), **spec.kwargs)
    except gym.error.DependencyNotInstalled as err:
        raise UserError(f"env {spec.label} needs an extra package ({first_line(err)}); install the project's pinned "
                        "requirements") from None
    except (TypeError, ValueError, AttributeError, gym.error.Error) as err:
        raise UserError(f"env {spec.label} cannot be made with kwargs {spec.kwargs} ({first_line(err)}); "
                        "fix its `kwargs`") from None
    for wrapper in spec.wrappers:
        env = _wrap(env, wrapper, spec)
    return env


def provider_versions(env: gym.Env) -> dict[str, str]:
    """The versions of the installed distributions whose code a made env runs: the modules of its classes and its
    wrappers', and of the objects it holds (mujoco's model, ale_py's emulator)."""
    classes = [type(layer) for layer in _layers(env)] + [type(value) for value in vars(env.unwrapped).values()]
    modules = {c.__module__.split(".")[0] for cls in classes for c in cls.__mro__}
    providers = metadata.packages_distributions()
    return {d: metadata.version(d) for d in sorted({d for m in modules for d in providers.get(m, [])})}


def _layers(env: gym.Env) -> list[gym.Env]:
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def env_spaces(spec: EnvSpec | str) -> tuple[gym.Space, gym.Space]:
    env = make_env(spec)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def time_limit(spec: EnvSpec) -> int | None:
    """The episode step limit the spec gives or its registration sets; None if it has none."""
    if spec.max_episode_steps or spec.entry_point:
        return spec.max_episode_steps
    return _registered(spec.id).max_episode_steps


def step_actions(actions, action_space: gym.Space):
    """A batch of policy actions as `env.step` takes them fastest: Python ints for a Discrete space, where
    gymnasium's check that an action is in the space is slow for numpy integers."""
    return actions.tolist() if isinstance(action_space, gym.spaces.Discrete) else actions


def _registered(env_id: str) -> gym.envs.registration.EnvSpec:
    try:
        return gym.spec(env_id)
    except gym.error.Error:
        close = _close_ids(env_id)
        hint = f"did you mean {', '.join(close)}?" if close else "is it registered by a module to `import` first?"
        raise UserError(f"unknown env id '{env_id}': {hint} (a spec may name the module that registers it, e.g. "
                        "{id: ALE/Pong-v5, import: [ale_py]}, or an entry_point)") from None


def _close_ids(env_id: str) -> list[str]:
    """Registered ids whose name (without namespace and version) is close to `env_id`'s: gymnasium's own before
    namespaced ones, newest version first."""
    def name(i: str) -> str:
        return i.split("/")[-1].rsplit("-v", 1)[0].lower()

    by_name: dict[str, list[str]] = {}
    for registered in sorted(gym.registry, key=lambda i: ("/" in i, -(gym.registry[i].version or 0))):
        by_name.setdefault(name(registered), []).append(registered)
    close = difflib.get_close_matches(name(env_id), by_name, n=2, cutoff=0.75)
    return [i for found in close for i in by_name[found]][:3]


def _wrapper_name(wrapper: str | dict) -> str:
    return wrapper if isinstance(wrapper, str) else next(iter(wrapper))


def _wrap(env: gym.Env, wrapper: str | dict, spec: EnvSpec) -> gym.Env:
    name = _wrapper_name(wrapper)
    kwargs = {} if isinstance(wrapper, str) else (wrapper[name] or {})
    if ":" in name:
        module, attr = name.split(":", 1)
        cls = getattr(_import(module, f"env {spec.label}: wrapper '{name}'"), attr, None)
    else:
        cls = getattr(gymnasium.wrappers, name, None)
    if cls is None:
        close = difflib.get_close_matches(name, gymnasium.wrappers.__all__, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "name one of gymnasium.wrappers or package.module:Name"
        raise UserError(f"env {spec.label}: unknown wrapper '{name}': {hint}")
    try:
        return cls(env, **kwargs)
    except (TypeError, ValueError, gym.error.Error) as err:
        raise UserError(f"env {spec.label}: wrapper {name} with kwargs {kwargs} fails ({first_line(err)})") from None


def _quiet_native_banners() -> None:
    """ale_py prints its banner on stderr for every emulator it starts; a healthy run prints our lines only."""
    ale = sys.modules.get("ale_py")
    if ale is not None:
        ale.ALEInterface.setLoggerMode(ale.LoggerMode.Error)


def _import(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise UserError(f"{what} cannot be imported ({err}); install its package or put it on PYTHONPATH") from None
