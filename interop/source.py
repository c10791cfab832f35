"""What a reader of data made elsewhere (interop/logs.py, interop/minari_io.py) hands to `orl datasets import`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np


@dataclass
class Source:
    """What a reader found, checked, before any byte is written."""

    observation_space: gym.Space
    action_space: gym.Space
    episodes: Iterator[dict[str, np.ndarray]]
    """Each episode's columns (all but eps_id and t) in order. A Minari dataset's are read as they are written,
    and a bad one raises UserError then."""
    episode_count: int
    with_logp: bool
    metadata: dict = field(default_factory=dict)
    """What the card keeps of the source: its own ids and metadata."""
    behavior: str = ""
    """The logging policy, as the source describes it."""
