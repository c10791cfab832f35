"""`orl collect`: one dataset from a DatasetConfig, collected by Ray actors and written by Ray Data as it goes."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import dataset_format as dataset
from collectors.config import CollectConfig, DatasetConfig
from collectors.policies import build_policy
from collectors.rollout import episodes_dataset, progress_lines
from common.envs import make_env, provider_versions

# The code a dataset's bytes depend on: dvc.yaml's collect stages declare the same folders (examples: the
# controllers that params.yaml names as behaviour policies).
COLLECTION_CODE = ("collectors", "common", "dataset_format", "examples")


@dataclasses.dataclass(frozen=True)
class Collection:
    """A collection whose inputs are checked, ready to run on Ray: `plan` makes it without starting anything."""

    name: str
    spec: DatasetConfig
    settings: CollectConfig
    out: str | Path
    card: dataset.DatasetCard
    """The card of the dataset to write, filled in as it is written."""

    @classmethod
    def plan(cls, name: str, spec: DatasetConfig, settings: CollectConfig, out: str | Path) -> Collection:
        """Refuses, before any work, an existing output, spaces a dataset cannot hold, a bad model path or URI, or a
        broken callable (tried once on a reset)."""
        out = dataset.refuse_existing(out)
        env = make_env(spec.env)
        try:
            observation_space, action_space = env.observation_space, env.action_space
            dataset.require_storable(observation_space, action_space, f"env {spec.env.label}")
            with_logp = build_policy(spec.policy, env).with_logp
            providers = provider_versions(env)
        finally:
            env.close()
        card = dataset.DatasetCard.new(name, spec.env, (observation_space, action_space),
                                       dataclasses.asdict(spec.policy), spec.seed, spec.episodes, with_logp,
                                       COLLECTION_CODE, providers)
        return cls(name, spec, settings, out, card)

    def run(self) -> dataset.DatasetCard:
        """Collects the episodes with Ray actors (Ray must be started) and writes them."""
        spec, settings, n = self.spec, self.settings, self.settings.episodes_per_task
        tasks = [list(range(s, min(s + n, spec.episodes))) for s in range(0, spec.episodes, n)]
        label = f"collect {self.name}"
        with progress_lines(label, spec.episodes) as progress:
            transitions = episodes_dataset(spec.env, spec.policy, spec.seed, tasks, settings.num_collectors,
                                           settings.envs_per_collector, progress, label)
            card = dataset.write(transitions, self.out, self.card, file_bytes=int(settings.file_mib * 2**20))
        print(f"[{label}] wrote {card.transitions} transitions in {len(card.files)} files to {self.out}; "
              f"return {card.returns['mean']:.1f} ± {card.returns['std']:.1f}", file=sys.stderr)
        return card


def collect(name: str, spec: DatasetConfig, settings: CollectConfig, out: str | Path) -> dataset.DatasetCard:
    """Collects the dataset `spec` describes to `out`, a local directory or an s3://bucket/prefix."""
    return Collection.plan(name, spec, settings, out).run()
