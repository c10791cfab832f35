"""benchmarks/d3rlpy_runner.py's own settings, run in d3rlpy's virtualenv on a real Pendulum dataset: in RLlib's
order (`update_order: rllib`) d3rlpy's CQL steps its policy by the gradient its loss has under the critics before
their step; in shuffled passes (`batch_draws: shuffled_passes`) every transition is drawn once a pass; RLlib's
temperature loss gives log t d3rlpy's gradient over t; RLlib's bounds clamp the policy's log-deviations; d3rlpy's
CQL trains from our CQL's initial weights with every setting at RLlib's; and ours starts from d3rlpy's."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from benchmarks.quality_table import D3RLPY_PYTHON
from tests.conftest import REPO, built_algorithm, run_benchmark

# Two CQLs built from one seed; one is stepped by hand from the critics as built, the other by `rllib_order_update`
# from the same torch seed. Their policies must agree, while the second's critics moved.
CHECK = """
import sys, types
from pathlib import Path
import d3rlpy, torch
sys.path.insert(0, "benchmarks")
import d3rlpy_runner as runner

_, _, data = runner.load(Path(sys.argv[1]))
count = data.transition_count
draw = runner.draw_in_shuffled_passes(data, seed=0)
drawn = [tuple(draw().observation.round(6)) for _ in range(2 * count)]
assert len(set(drawn[:count])) == count and sorted(drawn[:count]) == sorted(drawn[count:]), "a pass repeats a row"

def built(**config):
    d3rlpy.seed(0)
    algo = d3rlpy.algos.CQLConfig(batch_size=32, actor_encoder_factory=d3rlpy.models.VectorEncoderFactory([16]),
                                  critic_encoder_factory=d3rlpy.models.VectorEncoderFactory([16]),
                                  **config).create("cpu:0")
    algo.build_with_dataset(data)
    return algo

batch = data.sample_transition_batch(32)
by_hand, in_rllib_order = built(), built()
torch.manual_seed(1)
modules = by_hand.impl.modules
modules.actor_optim.zero_grad()
observations = torch.tensor(batch.observations)
by_hand.impl.compute_actor_loss(types.SimpleNamespace(observations=observations),
                                modules.policy(observations)).actor_loss.backward()
modules.actor_optim.step()
runner.update_in_rllib_order(in_rllib_order)
torch.manual_seed(1)
metrics = in_rllib_order.update(batch)

def weights(algo, part):
    return torch.cat([p.detach().flatten() for p in getattr(algo.impl.modules, part).parameters()])

assert torch.allclose(weights(by_hand, "policy"), weights(in_rllib_order, "policy"), atol=1e-7), "policy differs"
assert not torch.allclose(weights(by_hand, "q_funcs"), weights(in_rllib_order, "q_funcs")), "critics not stepped"
assert {"critic_loss", "conservative_loss", "actor_loss", "temp"} <= set(metrics), metrics

log_prob, gradients = torch.randn(32, 1), []
for step in (runner.temperature_step_on_log, type(by_hand.impl).update_temp):
    impl = built(initial_temperature=2.0).impl
    step(impl, log_prob)
    gradients.append(d3rlpy.models.torch.get_parameter(impl.modules.log_temp).grad.item())
assert abs(gradients[0] - gradients[1] / 2.0) < 1e-5, gradients

policy = built().impl.modules.policy
with torch.no_grad():
    for name, p in policy.named_parameters():
        if name.startswith("_logstd."):
            p.fill_(-10.0 if name.endswith("bias") else 0.0)
free = policy(observations)
policy.register_forward_hook(runner.clamp_log_std)
clamped = policy(observations)
assert torch.all(free.logstd == -10.0) and torch.all(clamped.logstd == -5.0), "log-deviations not clamped"
assert torch.equal(free.mu, clamped.mu) and torch.equal(free.squashed_mu, clamped.squashed_mu)
print("checked", count)
"""


@pytest.mark.slow  # d3rlpy's virtualenv starts and builds two small CQLs
@pytest.mark.skipif(not D3RLPY_PYTHON.exists(), reason="no d3rlpy virtualenv (make .venv-d3rlpy/.installed)")
def test_each_setting_changes_d3rlpys_cql_as_it_says(pendulum_dataset):
    run = subprocess.run([str(D3RLPY_PYTHON), "-c", CHECK, str(pendulum_dataset)], cwd=REPO, capture_output=True,
                         text=True, timeout=600)

    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1].startswith("checked")


def _train_cql(dataset, settings: dict, steps: int, *args) -> subprocess.CompletedProcess:
    """d3rlpy_runner.py training a small CQL on the dataset for `steps` updates (epochs of 10) with the runner's
    `settings`, then evaluating it on one episode; `args`, more of its options (`--save-initial-weights` trains
    nothing)."""
    return subprocess.run([str(D3RLPY_PYTHON), "benchmarks/d3rlpy_runner.py", "--dataset", str(dataset), "--algo",
                           "cql", "--seed", "0", "--steps", str(steps), "--epoch-updates", "10", "--batch-size", "32",
                           "--lr", "3e-4", "--hidden", "32", "32", "--eval-seeds", "[1]", "--config",
                           json.dumps(settings), *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow  # our CQL built on Ray, then d3rlpy's trained briefly in its own virtualenv
@pytest.mark.skipif(not D3RLPY_PYTHON.exists(), reason="no d3rlpy virtualenv (make .venv-d3rlpy/.installed)")
def test_d3rlpys_cql_trains_from_our_initial_weights_with_every_setting_at_rllibs(pendulum_dataset, tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["algos"]["cql"].update(hidden_layers=[32, 32], batch_size=32, lagrangian_threshold=10.0)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    weights = tmp_path / "weights.pt"
    saved = run_benchmark("cql_one_update", "--params", tmp_path / "params.yaml", "--dataset", pendulum_dataset,
                          "--draws", 2, "--save-weights", weights)
    assert saved.returncode == 0, saved.stderr[-3000:]

    settings = {"update_order": "rllib", "batch_draws": "shuffled_passes", "adam_eps": "rllib",
                "log_std_bounds": "rllib", "temperature_loss": "rllib", "initial_weights": str(weights)}
    run = _train_cql(pendulum_dataset, settings, steps=20)

    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(result["returns"]) == 1 and [epoch["epoch"] for epoch in result["metrics"]] == [1, 2]


@pytest.mark.skipif(not D3RLPY_PYTHON.exists(), reason="no d3rlpy virtualenv (make .venv-d3rlpy/.installed)")
def test_initial_weights_must_be_a_file(pendulum_dataset):
    run = _train_cql(pendulum_dataset, {"initial_weights": "no/such.pt"}, steps=10)

    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == ("--config: initial_weights is d3rlpy or a file of weights; "
                                                   "no/such.pt is no file")


@pytest.mark.slow  # d3rlpy's virtualenv builds a small CQL, then ours is built on Ray
@pytest.mark.skipif(not D3RLPY_PYTHON.exists(), reason="no d3rlpy virtualenv (make .venv-d3rlpy/.installed)")
def test_our_cql_starts_from_d3rlpys_initial_weights(pendulum_dataset, tmp_path):
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID

    from benchmarks.cql_one_update import start_from, to_d3rlpy
    from training.algorithms.rllib_internals import local_learner
    from training.config import CQLParams

    weights = tmp_path / "d3rlpy.pt"
    run = _train_cql(pendulum_dataset, {}, 10, "--save-initial-weights", weights)
    assert run.returncode == 0, run.stderr[-3000:]
    saved = torch.load(weights)

    params = CQLParams(iterations=1, updates_per_iteration=2, batch_size=32, hidden_layers=[32, 32])
    with built_algorithm("cql", params, pendulum_dataset) as algorithm:
        start_from(algorithm, weights)
        ours = to_d3rlpy(local_learner(algorithm).module[DEFAULT_MODULE_ID].state_dict())

    assert set(ours) == set(saved["weights"])
    assert all(torch.equal(ours[name], saved["weights"][name]) for name in ours)
