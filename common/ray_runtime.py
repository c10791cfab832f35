"""Starting Ray for an `orl` command or a benchmark: a cluster named by RAY_ADDRESS, or a local instance."""

from __future__ import annotations

import logging
import os


def start_ray(num_cpus: int) -> None:
    """Connects to RAY_ADDRESS when set; otherwise starts a local Ray of `num_cpus` CPUs (params' ray.num_cpus)."""
    import ray
    from ray.data import DataContext

    settings = {"include_dashboard": False, "logging_level": logging.WARNING}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **settings)
    else:
        # Token authentication, Ray's default for a new local instance, asked for explicitly: Ray warns at every
        # start when the mode is left unset.
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        ray.init(address="local", num_cpus=num_cpus, **settings)  # never join a stray local cluster
    DataContext.get_current().enable_progress_bars = False  # `orl` prints its own progress lines
    logging.getLogger("ray.data").setLevel(logging.WARNING)
