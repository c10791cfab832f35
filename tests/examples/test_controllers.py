"""The hand-written Atari controllers: their reading of the frames on drawn frames, and their play in the emulator."""

from __future__ import annotations

import numpy as np
import pytest

from examples.controllers import breakout, pong
from tests.conftest import REPO

BACKGROUND, UP, DOWN, NOOP = 87, 2, 3, 0
FIRE, RIGHT, LEFT = 1, 2, 3  # Breakout's


def suite_env(dataset: str):
    from common.envs import make_env
    from pipelines.params import load_params

    return make_env(load_params(REPO / "benchmarks" / "atari" / "params.yaml").dataset(dataset).env)


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
    env = suite_env("pong-expert")
    obs, _ = env.reset(seed=0)
    won = lost = 0
    while won + lost < 10:
        obs, reward, terminated, truncated, _ = env.step(int(pong(obs[None])[0]))
        won, lost = won + (reward > 0), lost + (reward < 0)
        assert not (terminated or truncated)
    env.close()
    assert won > lost, (won, lost)


def breakout_stack(paddle_column: int, ball_before: tuple[int, int] | None, ball_now: tuple[int, int] | None):
    """Four 84x84 frames as AtariPreprocessing draws Breakout: black, the paddle (8 columns wide) at the bottom, the
    ball in the last two frames."""
    stack = np.zeros((4, 84, 84), dtype=np.uint8)
    stack[:, 75:78, paddle_column - 4:paddle_column + 4] = 110
    for frame, ball in zip(stack[-2:], (ball_before, ball_now)):
        if ball is not None:
            frame[ball[0]:ball[0] + 2, ball[1]] = 142
    return stack


@pytest.mark.parametrize("paddle_column, ball_before, ball_now, action", [
    (20, (50, 60), (54, 60), RIGHT),  # falls straight down at column 60
    (40, (50, 12), (54, 8), LEFT),  # falls towards the left wall and bounces back out to about column 23
    (10, (50, 12), (54, 8), RIGHT),  # the same ball: the paddle waits for it right of where the straight path ends
    (30, (60, 30), (56, 31), NOOP),  # rises above the paddle: it follows the ball's column
    (30, None, None, FIRE),  # no ball in play: serve one
])
def test_breakout_moves_its_paddle_to_where_the_ball_will_land(paddle_column, ball_before, ball_now, action):
    stacks = np.stack([breakout_stack(paddle_column, ball_before, ball_now)] * 2)
    assert breakout(stacks).tolist() == [action, action]


def test_breakout_refuses_frames_it_cannot_read():
    with pytest.raises(ValueError, match=r"shape \(4, 84, 84\); got \(84, 84, 4\)"):
        breakout(np.zeros((1, 84, 84, 4), dtype=np.uint8))


def test_breakout_scores_far_above_random_play_with_sticky_actions():
    env = suite_env("breakout-expert")
    obs, _ = env.reset(seed=0)
    score, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(int(breakout(obs[None])[0]))
        score, done = score + reward, terminated or truncated
    env.close()
    assert score >= 20, score  # random play scores about 1
