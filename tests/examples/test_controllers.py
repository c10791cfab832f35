"""The hand-written controllers: Pong's reading of the frames on drawn frames, and its play in the emulator."""

from __future__ import annotations

import numpy as np
import pytest

from examples.controllers import pong
from tests.conftest import REPO

BACKGROUND, UP, DOWN, NOOP = 87, 2, 3, 0


def pong_stack(paddle_rows: tuple[int, int], ball_before: tuple[int, int], ball_now: tuple[int, int]) -> np.ndarray:
    """Four 84x84 frames as AtariPreprocessing draws Pong: our paddle on the right, the ball in the last two."""
    stack = np.full((4, 84, 84), BACKGROUND, dtype=np.uint8)
    stack[:, paddle_rows[0]:paddle_rows[1] + 1, 73:76] = 147
    for frame, (row, column) in zip(stack[-2:], (ball_before, ball_now)):
        frame[row:row + 2, column] = 236
    return stack


@pytest.mark.parametrize("paddle_rows, ball_before, ball_now, action", [
    ((20, 26), (40, 40), (43, 44), DOWN),  # crosses the paddle's column near row 66, below it
    ((60, 66), (70, 40), (74, 44), UP),  # heads for the bottom wall and bounces back up to about row 46
    ((42, 48), (40, 44), (43, 40), NOOP),  # moves away: the paddle waits in the middle, where it is
    ((60, 66), (50, 30), (50, 34), UP),  # straight across at row 50
])
def test_pong_moves_its_paddle_to_where_the_ball_will_cross(paddle_rows, ball_before, ball_now, action):
    stacks = np.stack([pong_stack(paddle_rows, ball_before, ball_now)] * 2)
    assert pong(stacks).tolist() == [action, action]


def test_pong_refuses_frames_it_cannot_read():
    with pytest.raises(ValueError, match=r"shape \(4, 84, 84\); got \(84, 84, 4\)"):
        pong(np.zeros((1, 84, 84, 4), dtype=np.uint8))


@pytest.mark.slow  # about 2,000 emulated steps
def test_pong_wins_more_points_than_it_loses_with_sticky_actions():
    from common.envs import make_env
    from pipelines.params import load_params

    env = make_env(load_params(REPO / "benchmarks" / "atari" / "params.yaml").dataset("pong-expert").env)
    obs, _ = env.reset(seed=0)
    won = lost = 0
    while won + lost < 10:
        obs, reward, terminated, truncated, _ = env.step(int(pong(obs[None])[0]))
        won, lost = won + (reward > 0), lost + (reward < 0)
        assert not (terminated or truncated)
    env.close()
    assert won > lost, (won, lost)
