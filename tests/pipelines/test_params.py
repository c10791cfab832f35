"""params.yaml parsing: typed dataclasses, and one-line errors that name the bad key."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from common.envs import EnvSpec
from common.errors import UserError
from pipelines.params import load_params
from tests.conftest import REPO

TOUR, SUITE = REPO / "params.yaml", REPO / "benchmarks" / "suite" / "params.yaml"
ATARI = REPO / "benchmarks" / "atari" / "params.yaml"


def write_params(tmp_path, mutate):
    params = yaml.safe_load(SUITE.read_text())  # the full suite's: every section and kind of entry
    mutate(params)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.mark.parametrize("path", [TOUR, SUITE], ids=["tour", "suite"])
def test_the_pipelines_params_parse(path):
    params = load_params(path)
    assert params.datasets["cartpole-expert"].policy.callable == "examples.controllers:cartpole"
    assert params.datasets["cartpole-expert"].env == EnvSpec(id="CartPole-v1")
    assert params.references["CartPole-v1"].ceiling.callable == "examples.controllers:cartpole"
    assert params.algos.marwil.beta == 1.0 and params.algos.bc.hidden_layers == [256, 256]
    assert {run.dataset for run in params.train.runs.values()} <= set(params.all_datasets)
    assert params.dataset("cartpole-learned").policy.model == "runs/dqn-cartpole-random/checkpoint"


@pytest.mark.parametrize("game", ["pong", "breakout"])
def test_the_atari_suites_params_parse_into_stacks_its_controllers_play(game):
    from common.envs import env_spaces

    params = load_params(ATARI)
    env = params.dataset(f"{game}-expert").env
    assert all(params.dataset(f"{game}-{kind}").env == env for kind in ("medium", "mixed", "random"))
    assert env_spaces(env)[0].shape == (4, 84, 84)
    assert params.references[env.id].ceiling.callable == f"examples.controllers:{game}"
    assert params.dataset(f"{game}-medium").policy.base == params.dataset(f"{game}-expert").policy
    assert {run.dataset for run in params.train.runs.values()} == set(params.all_datasets)
    assert {run.algo for run in params.train.runs.values()} == {"bc", "dqn", "cql_dqn", "iql"}


def test_the_mujoco_suites_params_parse_with_d4rls_reference_returns():
    params = load_params(REPO / "benchmarks" / "mujoco" / "params.yaml")
    assert params.references["Hopper-v5"].ref_max == 3234.3 and params.references["HalfCheetah-v5"].ceiling is None
    replays = {"halfcheetah-medium-replay", "hopper-medium-replay"}  # D4RL's, from the PPO runs to medium
    assert {run.dataset for run in params.train.runs.values()} == {*params.all_datasets, *replays}
    assert {run.algo for run in params.train.runs.values()} == {"bc", "cql", "iql"}
    for name, online in params.online_policies.items():  # each medium or expert dataset samples its PPO policy
        assert params.dataset(name).policy.model == f"runs/ppo-{name}/checkpoint"
        assert params.dataset(name).env == online.env


def test_per_dataset_values_replace_the_sections_for_that_dataset_only():
    iql = load_params(SUITE).algos.iql
    assert iql.for_dataset("lunarlander-medium").beta == 0.1 and iql.for_dataset("lunarlander-medium").per_dataset == {}
    assert iql.for_dataset("cartpole-medium") == dataclasses.replace(iql, per_dataset={})
    assert iql.beta == 1.0


def test_a_per_dataset_value_sets_an_optional_hyper_parameter():
    cql = dataclasses.replace(load_params(SUITE).algos.cql, per_dataset={"x": {"lagrangian_threshold": 10}})
    assert cql.lagrangian_threshold is None
    threshold = cql.for_dataset("x").lagrangian_threshold
    assert threshold == 10.0 and type(threshold) is float


def test_the_suite_trains_behaviour_policies_online():
    params = load_params(SUITE)
    assert params.online_policy("lunarlander-ppo").target_score == 40
    assert params.dataset("lunarlander-ppo").policy.model == "runs/ppo-lunarlander-ppo/checkpoint"


@pytest.mark.parametrize("mutate,message", [
    (lambda p: p["datasets"]["cartpole-expert"].update(episodes=-5),
     r"datasets.cartpole-expert: episodes must be > 0, got -5"),
    (lambda p: p["datasets"]["cartpole-expert"].update(env={"id": "CartPole-v1", "entry_point": "a.b:C"}),
     r"datasets.cartpole-expert.env: an env spec gives either `id` .* or `entry_point`"),
    (lambda p: p["datasets"]["cartpole-expert"].update(env={"id": "CartPole-v1", "wrapers": []}),
     r"unknown key 'datasets.cartpole-expert.env.wrapers'; known keys: id, entry_point, kwargs, import, wrappers"),
    (lambda p: p["datasets"]["cartpole-expert"].update(env={"entry_point": "my_sim.Env"}),
     r"entry_point 'my_sim.Env' must read package.module:Name"),
    (lambda p: p["datasets"]["cartpole-expert"]["policy"].update(kind="expert"),
     r"kind 'expert' is unknown; use one of random, callable, mixture, model"),
    (lambda p: p["datasets"]["cartpole-medium"]["policy"].pop("base"),
     r"kind 'mixture' needs `base`, the policy it mixes with random actions"),
    (lambda p: p["datasets"]["cartpole-expert"]["policy"].update(callable="examples.controllers.cartpole"),
     r"kind 'callable' needs `callable: package.module:function`"),
    (lambda p: p["references"]["CartPole-v1"].update(ref_max=500.0),
     r"references.CartPole-v1: give the ceiling as a policy \(`ceiling`\) or a return \(`ref_max`\), not both"),
    (lambda p: p["algos"]["bc"].update(lr="fast"), r"algos.bc.lr must be a float, got 'fast'"),
    (lambda p: p["algos"]["marwil"].update(beta=3), r"algos.marwil: beta must be in \[0, 1\], got 3"),
    (lambda p: p["algos"]["bc"].update(action_distribution="tanh"),
     r"algos.bc: action_distribution 'tanh' is unknown; use one of gaussian, squashed_gaussian, deterministic"),
    (lambda p: p["algos"]["cql"].update(target_action="max"),
     r"algos.cql: target_action 'max' is unknown; use one of sampled, mean"),
    (lambda p: p["algos"]["cql"].update(next_actions_penalized_at="both"),
     r"algos.cql: next_actions_penalized_at 'both' is unknown; use one of current, next"),
    (lambda p: p["train"]["runs"].update(x={"algo": "ppo", "dataset": "cartpole-expert"}),
     r"train.runs.x: unknown algorithm 'ppo': use one of bc, marwil"),
    (lambda p: p["train"]["runs"].update(x={"algo": "bc", "dataset": "nope"}),
     r"train.runs.x.dataset names \['nope'\]"),
    (lambda p: p["collect"].update(num_colectors=3), r"unknown key 'collect.num_colectors'"),
    (lambda p: p["datasets"]["cartpole-medium"]["policy"].update(epsilon=1.5), r"epsilon 1.5 is out of range"),
    (lambda p: p["datasets"]["pendulum-expert"]["policy"].update(action_noise=-0.1),
     r"datasets.pendulum-expert.policy: action_noise -0.1 is negative"),
    (lambda p: p["datasets"]["pendulum-random"]["policy"].update(action_noise=0.1),
     r"action_noise applies to kind 'callable' \(a mixture's `base`\), not 'random'"),
    (lambda p: p["policy_datasets"]["cartpole-learned"]["policy"].update(kind="random"),
     r"policy_datasets.cartpole-learned.policy must be kind 'model' with a checkpoint directory"),
    (lambda p: p["algos"]["marwil"].update(advantage_norm_rate=0), r"advantage_norm_rate must be in \(0, 1\]"),
    (lambda p: p["algos"]["bc"].update(num_learners=-1), r"algos.bc: num_learners must be >= 0, got -1"),
    (lambda p: p["collect"].update(file_mib=0), r"collect: file_mib must be > 0, got 0"),
    (lambda p: p["online_policies"]["lunarlander-ppo"].update(target_score=100),
     r"online_policies.lunarlander-ppo: target_score must be below 100 \(the expert\), got 100"),
    (lambda p: p["online_policies"]["lunarlander-ppo"].update(held_out_episodes=-1),
     r"online_policies.lunarlander-ppo: held_out_episodes must be >= 0 \(0 scores the training episodes\), got -1"),
    (lambda p: p["algos"]["iql"]["per_dataset"].update({"lunarlander-meduim": {"beta": 0.3}}),
     r"algos.iql.per_dataset names \['lunarlander-meduim'\], which are not under `datasets`"),
    (lambda p: p["datasets"].update({"lunarlander-ppo-replay": p["datasets"]["cartpole-expert"]}),
     r"lunarlander-ppo-replay is the replay of online_policies.lunarlander-ppo and another dataset's name"),
    (lambda p: p["algos"]["iql"]["per_dataset"].update({"cartpole-medium": {"betta": 0.3}}),
     r"algos.iql: per_dataset.cartpole-medium: unknown key 'betta'; known keys: lr, "),
    (lambda p: p["algos"]["iql"]["per_dataset"].update({"cartpole-medium": {"beta": "high"}}),
     r"algos.iql: per_dataset.cartpole-medium: beta must be a float, got 'high'"),
    (lambda p: p["algos"]["iql"]["per_dataset"].update({"cartpole-medium": {"hidden_layers": [64, "wide"]}}),
     r"algos.iql: per_dataset.cartpole-medium: hidden_layers must be a list of int, got \[64, 'wide'\]"),
    (lambda p: p["algos"]["iql"]["per_dataset"].update({"cartpole-medium": {"iterations": True}}),
     r"algos.iql: per_dataset.cartpole-medium: iterations must be an int, got True"),
    (lambda p: p["algos"]["iql"]["per_dataset"].update({"cartpole-medium": {"beta": -1}}),
     r"algos.iql: per_dataset.cartpole-medium: beta must be >= 0, got -1"),
    (lambda p: p["algos"]["cql"].update(per_dataset={"cartpole-medium": {"lagrangian_threshold": "high"}}),
     r"algos.cql: per_dataset.cartpole-medium: lagrangian_threshold must be a float or None, got 'high'"),
    (lambda p: p["algos"]["cql"].update(min_q_weight=0, lagrangian_threshold=10),
     r"algos.cql: lagrangian_threshold scales the penalty of min_q_weight, which is 0"),
    (lambda p: p["online_policies"]["lunarlander-ppo"].update(env={"name": "Lunar"}),
     r"online_policies.lunarlander-ppo.env: an env spec gives either `id`"),
])
def test_bad_params_name_the_key(tmp_path, mutate, message):
    with pytest.raises(UserError, match=message) as err:
        load_params(write_params(tmp_path, mutate))
    assert "\n" not in str(err.value) and str(tmp_path / "params.yaml") in str(err.value)


def test_a_missing_params_file_says_what_to_do(tmp_path):
    with pytest.raises(UserError, match="not found; run from the project root"):
        load_params(tmp_path / "params.yaml")
