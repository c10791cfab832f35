"""benchmarks/cql_one_update.py: our CQL's update beside d3rlpy's, from the same weights and batch; our CQL started
from a file of weights by d3rlpy's names."""

from __future__ import annotations

import pytest
import yaml

from benchmarks.cql_one_update import from_d3rlpy, start_from, to_d3rlpy
from benchmarks.quality_table import D3RLPY_PYTHON
from tests.conftest import REPO, built_algorithm, run_benchmark


def test_our_policy_head_splits_into_d3rlpys_means_and_log_deviations():
    import torch

    head = torch.arange(12.0).view(6, 2)  # 3 action dimensions: 3 means, then 3 log-deviations
    weights = to_d3rlpy({"pi.net.mlp.0.weight": head, "pi.log_std_clip_param_const": torch.ones(1),
                         "qf_twin_encoder.net.mlp.2.bias": torch.zeros(4), "target_qf.net.mlp.0.weight": head})
    assert torch.equal(weights["policy._mu.weight"], head[:3])
    assert torch.equal(weights["policy._logstd.weight"], head[3:])
    assert set(weights) == {"policy._mu.weight", "policy._logstd.weight", "q_funcs.1._encoder._layers.2.bias",
                            "targ_q_funcs.0._fc.weight"}


def test_our_weights_come_back_from_d3rlpys_names():
    import torch

    ours = {"pi.net.mlp.0.weight": torch.randn(6, 2), "pi.net.mlp.0.bias": torch.randn(6),
            "pi_encoder.net.mlp.2.weight": torch.randn(2, 2), "qf_twin.net.mlp.0.bias": torch.randn(1),
            "target_qf_encoder.net.mlp.0.weight": torch.randn(2, 4)}
    back = from_d3rlpy(to_d3rlpy(ours), list(ours))
    assert set(back) == set(ours) and all(torch.equal(back[name], ours[name]) for name in ours)


@pytest.mark.slow  # our CQL built on Ray
def test_our_cql_starts_from_a_file_of_weights_by_d3rlpys_names(pendulum_dataset, tmp_path):
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID

    from training.algorithms.rllib_internals import local_learner
    from training.config import CQLParams

    params = CQLParams(iterations=1, updates_per_iteration=2, batch_size=32, hidden_layers=[32, 32],
                       lagrangian_threshold=10.0)
    with built_algorithm("cql", params, pendulum_dataset) as algorithm:
        learner = local_learner(algorithm)
        module = learner.module[DEFAULT_MODULE_ID]
        other = {name: torch.randn_like(tensor) for name, tensor in to_d3rlpy(module.state_dict()).items()}
        path = tmp_path / "weights.pt"
        torch.save({"weights": other, "log_temperature": 0.25, "log_conservative_weight": -0.5}, path)
        start_from(algorithm, path)

        now = to_d3rlpy(module.state_dict())
        assert set(now) == set(other) and all(torch.equal(now[name], other[name]) for name in other)
        assert learner.curr_log_alpha[DEFAULT_MODULE_ID].item() == 0.25
        assert learner.log_conservative_weights[DEFAULT_MODULE_ID].item() == -0.5
        algorithm.train()
        assert not torch.equal(to_d3rlpy(module.state_dict())["q_funcs.0._fc.weight"], other["q_funcs.0._fc.weight"])

        del other["q_funcs.1._fc.bias"]
        torch.save({"weights": other, "log_temperature": 0.0, "log_conservative_weight": 0.0}, path)
        with pytest.raises(SystemExit, match="weights.pt: its weights do not map onto our CQL's networks"):
            start_from(algorithm, path)


def _table(stdout: str) -> dict[str, list[str]]:
    """The printed tables' rows, by their first cell."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in stdout.splitlines()
            if line.startswith("| ")]
    return {row[0]: row[1:] for row in rows}


@pytest.mark.slow  # our CQL built and trained on Ray, and d3rlpy's in its own virtualenv
@pytest.mark.skipif(not D3RLPY_PYTHON.exists(), reason="no d3rlpy virtualenv (make .venv-d3rlpy/.installed)")
def test_our_cql_computes_d3rlpys_update(pendulum_dataset, tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["algos"]["cql"].update(hidden_layers=[32, 32], batch_size=64, lagrangian_threshold=10.0)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))

    result = run_benchmark("cql_one_update", "--params", tmp_path / "params.yaml", "--dataset", pendulum_dataset,
                           "--updates-before", 20, "--draws", 100)

    assert result.returncode == 0, result.stderr[-3000:]
    table = _table(result.stdout)
    for term in ("q_data", "q_twin_data", "target", "td_loss", "policy_mean", "policy_log_std"):
        _, _, difference, error = table[term]
        assert error == "exact" and float(difference) == pytest.approx(0.0, abs=1e-3), term
    for term in ("conservative_gap", "policy_logp", "actor_loss"):
        _, _, difference, error = table[term]
        assert abs(float(difference)) < 5 * float(error) + 1e-4, term
    for network in ("critic 1", "critic 2", "entropy temperature", "conservative weight"):
        cosine, norms, _, _ = table[network]
        assert float(cosine) > 0.99 and float(norms) == pytest.approx(1.0, abs=0.05), network
    cosine, norms, own_cosine, _ = table["policy"]  # its sampled actions make it the noisiest
    assert float(cosine) > float(own_cosine) - 0.1 and float(norms) == pytest.approx(1.0, abs=0.3)
