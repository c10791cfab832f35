"""benchmarks/d3rlpy_runner.py's own settings, run in d3rlpy's virtualenv on a real Pendulum dataset: in RLlib's
order (`update_order: rllib`) d3rlpy's CQL steps its policy by the gradient its loss has under the critics before
their step; in shuffled passes (`batch_draws: shuffled_passes`) every transition is drawn once a pass."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks.quality_table import D3RLPY_PYTHON
from tests.conftest import REPO

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

def built():
    d3rlpy.seed(0)
    algo = d3rlpy.algos.CQLConfig(batch_size=32, actor_encoder_factory=d3rlpy.models.VectorEncoderFactory([16]),
                                  critic_encoder_factory=d3rlpy.models.VectorEncoderFactory([16])).create("cpu:0")
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
print("checked", count)
"""


@pytest.mark.slow  # d3rlpy's virtualenv starts and builds two small CQLs
@pytest.mark.skipif(not D3RLPY_PYTHON.exists(), reason="no d3rlpy virtualenv (make .venv-d3rlpy/.installed)")
def test_rllib_order_steps_the_policy_from_the_critics_before_their_step_and_passes_draw_each_row_once(
        pendulum_dataset):
    run = subprocess.run([str(D3RLPY_PYTHON), "-c", CHECK, str(pendulum_dataset)], cwd=REPO, capture_output=True,
                         text=True, timeout=600)

    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1].startswith("checked")
