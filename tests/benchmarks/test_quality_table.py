"""benchmarks/quality_table.py's table: a cell trained for a time budget (`--train-seconds`) says how many updates
its seeds made in it, as a cell with other settings says so."""

from __future__ import annotations

from benchmarks.quality_table import markdown


def test_a_time_budgeted_cell_gives_its_seeds_updates_and_the_budget():
    results = {"pong-expert": {
        "env_id": "ALE/Pong-v5",
        "scores": {"behaviour": [97.6], "bc": [58.0, 55.5], "cql_dqn": [-3.4, -3.2]},
        "overrides": {"bc": {"batch_size": 256}, "cql_dqn": {}},
        "train_seconds": {"bc": 210.0, "cql_dqn": None},
        "updates_made": {"bc": {"0": 17500, "1": 17000}, "cql_dqn": {"0": 25000, "1": 25000}},
    }}
    row = markdown(results, ["behaviour", "bc", "cql_dqn"]).splitlines()[-1]
    assert row == ("| ALE/Pong-v5 | pong-expert | 97.6 | 56.8 ± 1.2 (batch_size 256, 17,000-17,500 updates, a 210s "
                   "budget) | -3.3 ± 0.1 |")
