"""References and normalized scores: random and expert returns measured on the evaluation seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from collectors.config import PolicyConfig
from collectors.rollout import EpisodeRunner
from common.envs import EnvSpec
from common.errors import UserError
from dataset_format import episode_stats
from evaluation.config import EvaluateConfig, ReferenceConfig
from evaluation.evaluate import measure_references
from evaluation.references import normalized_score, read_reference, reference_path
from tests.conftest import CARTPOLE_EXPERT

REFERENCE = {"env_id": "CartPole-v1", "seed": 1_000_000, "episodes": 20,
             "random": {"mean": 22.0}, "expert": {"mean": 500.0}}
TINY = EvaluateConfig(episodes=3, seed=77, num_workers=2)


def test_normalized_score_is_0_for_random_and_100_for_expert():
    assert normalized_score(22.0, REFERENCE) == 0.0
    assert normalized_score(500.0, REFERENCE) == 100.0
    assert normalized_score(261.0, REFERENCE) == pytest.approx(50.0)
    assert normalized_score(0.0, REFERENCE) < 0  # worse than random is below 0


def test_normalized_score_with_negative_returns():
    pendulum = {"random": {"mean": -1200.0}, "expert": {"mean": -200.0}}
    assert normalized_score(-1200.0, pendulum) == 0.0
    assert normalized_score(-200.0, pendulum) == 100.0
    assert normalized_score(-700.0, pendulum) == pytest.approx(50.0)


def test_read_reference_returns_one_measured_on_the_configured_seeds(tmp_path):
    path = reference_path(tmp_path, "CartPole-v1")
    path.write_text(json.dumps(REFERENCE))
    assert path == tmp_path / "CartPole-v1.json"
    assert read_reference(tmp_path, "CartPole-v1", EvaluateConfig()) == REFERENCE


def test_read_reference_refuses_a_missing_file_naming_it(tmp_path):
    with pytest.raises(UserError) as err:
        read_reference(tmp_path, "CartPole-v1", EvaluateConfig())
    assert str(tmp_path / "CartPole-v1.json") in str(err.value) and "orl reference" in str(err.value)


@pytest.mark.parametrize("config", [EvaluateConfig(seed=5), EvaluateConfig(episodes=10)])
def test_read_reference_refuses_one_measured_on_other_seeds_naming_it(config, tmp_path):
    (tmp_path / "CartPole-v1.json").write_text(json.dumps(REFERENCE))
    with pytest.raises(UserError) as err:
        read_reference(tmp_path, "CartPole-v1", config)
    assert str(tmp_path / "CartPole-v1.json") in str(err.value)
    assert "other evaluation seeds" in str(err.value)


def test_normalized_score_is_none_without_a_ceiling():
    assert normalized_score(50.0, {"random": {"mean": 22.0}}) is None


@pytest.mark.slow  # every reference policy's episodes, by Ray actors
def test_measure_references_writes_random_and_expert_returns_on_the_seeds(ray_local, tmp_path):
    references = tmp_path / "references"
    measure_references([EnvSpec.of("CartPole-v1")], {"CartPole-v1": ReferenceConfig(ceiling=CARTPOLE_EXPERT)}, TINY,
                       references)

    assert [p.name for p in references.iterdir()] == ["CartPole-v1.json"]
    result = json.loads((references / "CartPole-v1.json").read_text())
    assert (result["env_id"], result["seed"], result["episodes"]) == ("CartPole-v1", 77, 3)
    assert result["expert"]["mean"] > result["random"]["mean"]
    for kind, policy in (("random", PolicyConfig(kind="random")), ("expert", CARTPOLE_EXPERT)):
        assert set(result[kind]) == {"mean", "std", "min", "max"}
        # The episodes are those of the evaluation seed: the same returns as running them here.
        returns, _ = episode_stats(EpisodeRunner("CartPole-v1", policy, TINY.seed, 1).run([0, 1, 2]))
        assert result[kind]["mean"] == pytest.approx(np.mean(returns))
        assert result[kind]["min"] == pytest.approx(returns.min()) and result[kind]["max"] == pytest.approx(returns.max())
    # What it wrote is what evaluation then accepts, and scores the references 0 and 100.
    reference = read_reference(references, "CartPole-v1", TINY)
    assert normalized_score(result["random"]["mean"], reference) == 0.0
    assert normalized_score(result["expert"]["mean"], reference) == 100.0


def test_fixed_references_are_written_as_given_and_an_env_without_a_ceiling_has_none(ray_local, tmp_path):
    references = tmp_path / "references"
    measure_references([EnvSpec.of("CartPole-v1"), EnvSpec(id="Acrobot-v1", name="acrobot")],
                       {"CartPole-v1": ReferenceConfig(ref_min=10.0, ref_max=510.0)}, TINY, references)
    given = read_reference(references, "CartPole-v1", TINY)
    assert given["random"] == {"mean": 10.0, "given": True} and given["expert"] == {"mean": 510.0, "given": True}
    assert normalized_score(260.0, given) == 50.0
    unscored = read_reference(references, "acrobot", TINY)  # named by the spec's name
    assert "expert" not in unscored and unscored["random"]["mean"] == pytest.approx(-500.0)
