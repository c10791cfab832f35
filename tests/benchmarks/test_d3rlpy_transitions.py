"""benchmarks/d3rlpy_transitions.py, in d3rlpy's virtualenv, on a real Pendulum dataset: d3rlpy's transitions are its
rows less each episode's last (Pendulum's time limit ends every one), and a next observation changed in one row
shows."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.quality_table import D3RLPY_PYTHON
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not D3RLPY_PYTHON.exists(),
                                reason="no d3rlpy virtualenv (make .venv-d3rlpy/.installed)")


def _compare(dataset) -> dict:
    run = subprocess.run([str(D3RLPY_PYTHON), "benchmarks/d3rlpy_transitions.py", "--dataset", str(dataset)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_d3rlpys_transitions_are_the_rows(pendulum_dataset):
    card = json.loads((pendulum_dataset / "_card.json").read_text())

    result = _compare(pendulum_dataset)

    assert result == {"rows": card["transitions"], "transitions": card["transitions"] - card["episodes"],
                      "largest_difference": 0.0, "terminal_flags_differ": 0}


def test_a_changed_next_observation_shows(pendulum_dataset, tmp_path):
    changed = shutil.copytree(pendulum_dataset, tmp_path / "changed")
    path = changed / json.loads((changed / "_card.json").read_text())["files"][0]["path"]
    table = pq.read_table(path)
    new_obs = table.column("new_obs").combine_chunks()
    values = new_obs.flatten().to_numpy().copy()
    values[0] += 0.5  # the first row's next observation, which d3rlpy takes from the second row
    column = pa.FixedSizeListArray.from_arrays(pa.array(values, new_obs.type.value_type), new_obs.type.list_size)
    pq.write_table(table.set_column(table.schema.get_field_index("new_obs"), "new_obs", column), path)

    result = _compare(changed)

    assert np.isclose(result["largest_difference"], 0.5, atol=1e-6)
