"""Hand-written controllers for Gymnasium's classic-control and Box2D tasks and for Atari Pong and Breakout:
behaviour policies of kind `callable` (`callable: examples.controllers:cartpole`), and the expert references of the
quick tour, the full suite and the Atari suite (params.yaml's `references:`).

A controller takes a batch of observations, one row per environment, and returns a batch of actions. These are
deterministic, so they return no log-probabilities (collectors/policies.py's `CallablePolicy` documents the
contract). Each is a per-row function mapped over the batch, so their actions, and the datasets collected with
them, are bit-for-bit those of the expert table they replace.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def _cartpole_one(obs: np.ndarray) -> int:
    x, x_dot, theta, theta_dot = obs
    # Push towards where the pole is falling, with a weak pull back to the centre.
    return int(theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0)


def _acrobot_one(obs: np.ndarray) -> int:
    # Torque along the second joint's velocity pumps energy into the swing.
    return 2 if obs[5] > 0 else 0


def _pendulum_one(obs: np.ndarray) -> np.ndarray:
    cos_theta, sin_theta, theta_dot = obs
    if cos_theta > 0.85:  # near the top: PD stabilisation
        torque = -(10.0 * np.arctan2(sin_theta, cos_theta) + 2.0 * theta_dot)
    else:  # energy pumping until the swing carries the pendulum up
        energy = 0.5 * theta_dot**2 + 10.0 * (cos_theta - 1.0)
        torque = 2.0 * np.sign(theta_dot) * (1.0 if energy < 0 else -1.0)
    return np.array([np.clip(torque, -2.0, 2.0)], dtype=np.float32)


# gymnasium's heuristic reads only whether the lander's actions are continuous.
_DISCRETE_LANDER = SimpleNamespace(unwrapped=SimpleNamespace(continuous=False))


def _lunar_lander_one(obs: np.ndarray) -> int:
    from gymnasium.envs.box2d.lunar_lander import heuristic

    return int(heuristic(_DISCRETE_LANDER, obs))


def cartpole(obs: np.ndarray) -> np.ndarray:
    """CartPole-v1: balances the pole for all 500 steps."""
    return np.array([_cartpole_one(o) for o in obs])


def acrobot(obs: np.ndarray) -> np.ndarray:
    """Acrobot-v1: swings up in about 80 steps."""
    return np.array([_acrobot_one(o) for o in obs])


def pendulum(obs: np.ndarray) -> np.ndarray:
    """Pendulum-v1: energy pumping, then PD stabilisation at the top."""
    return np.array([_pendulum_one(o) for o in obs])


def lunar_lander(obs: np.ndarray) -> np.ndarray:
    """LunarLander-v3 (discrete): gymnasium's own heuristic lander."""
    return np.array([_lunar_lander_one(o) for o in obs])


# Pong as AtariPreprocessing draws it (84x84 grey, the playing field between the walls) under a 4-frame
# FrameStackObservation: rows and columns of the frame, and the background's grey.
_PONG_FIELD_ROWS = (14, 77)  # between the top and bottom walls
_PONG_BALL_COLUMNS = (11, 73)  # between the two paddles' columns
_PONG_PADDLE_COLUMN = 74  # ours, on the right
_PONG_BACKGROUND = 87
_PONG_UP, _PONG_DOWN, _PONG_NOOP = 2, 3, 0  # ALE's RIGHT and LEFT move our paddle up and down
# How far (in rows) the predicted crossing may be from where the paddle would coast to before it moves. Scores
# hardly change between 3 and 8 rows (benchmarks/atari.md, "The Pong expert").
_PONG_DEAD_BAND = 6.0


def _between_walls(position: float, low: float, span: float) -> float:
    """Where a straight path that would reach `position` ends between walls at `low` and `low + span`: each bounce
    mirrors the path."""
    folded = (position - low) % (2 * span)
    return low + span - abs(span - folded)


def _check_stack(controller: str, stack: np.ndarray) -> None:
    if stack.shape != (4, 84, 84):
        raise ValueError(f"{controller} reads stacks of 4 AtariPreprocessing frames, shape (4, 84, 84); "
                         f"got {stack.shape}")


def _pong_ball(frame: np.ndarray) -> tuple[float, float] | None:
    top, bottom = _PONG_FIELD_ROWS
    left, right = _PONG_BALL_COLUMNS
    rows, columns = np.nonzero(frame[top:bottom, left:right] != _PONG_BACKGROUND)
    return (rows.mean() + top, columns.mean() + left) if len(rows) else None


def _pong_paddle(frame: np.ndarray) -> float | None:
    top, bottom = _PONG_FIELD_ROWS
    rows = np.nonzero(frame[top:bottom, _PONG_PADDLE_COLUMN] != _PONG_BACKGROUND)[0]
    return (rows.min() + rows.max()) / 2 + top if len(rows) else None


def _pong_intercept(before: np.ndarray, now: np.ndarray) -> float | None:
    """The row at which the ball reaches our paddle, bouncing off the walls, or None while it moves away."""
    ball, previous = _pong_ball(now), _pong_ball(before)
    if ball is None or previous is None or ball[1] <= previous[1]:
        return None
    row_speed, column_speed = ball[0] - previous[0], ball[1] - previous[1]
    row = ball[0] + row_speed * (_PONG_PADDLE_COLUMN - ball[1]) / column_speed
    # The rows the ball's centre can reach: it is 2 rows tall and bounces off the walls' inner rows.
    return _between_walls(row, _PONG_FIELD_ROWS[0] + 1, _PONG_FIELD_ROWS[1] - _PONG_FIELD_ROWS[0] - 3)


def _pong_one(stack: np.ndarray) -> int:
    _check_stack("pong", stack)
    paddle, previous = _pong_paddle(stack[-1]), _pong_paddle(stack[-2])
    if paddle is None:
        return _PONG_NOOP
    target = _pong_intercept(stack[-2], stack[-1])
    if target is None:  # the ball moves away: wait in the middle
        target = sum(_PONG_FIELD_ROWS) / 2
    # Where the paddle would coast to if released: its speed decays by about half each step.
    coasting = paddle + (0.0 if previous is None else paddle - previous)
    if target < coasting - _PONG_DEAD_BAND:
        return _PONG_UP
    if target > coasting + _PONG_DEAD_BAND:
        return _PONG_DOWN
    return _PONG_NOOP


def pong(obs: np.ndarray) -> np.ndarray:
    """ALE/Pong-v5 with AtariPreprocessing and FrameStackObservation(4): reads the ball and its paddle from the last
    two frames, predicts where the ball will cross the paddle's column (bouncing off the walls), and moves there."""
    return np.array([_pong_one(o) for o in obs])


# Breakout as AtariPreprocessing draws it (84x84 grey on black) under a 4-frame FrameStackObservation.
_BREAKOUT_FIELD_COLUMNS = (5, 79)  # between the side walls
_BREAKOUT_BALL_ROWS = ((13, 22), (38, 75))  # above the bricks (once it breaks through) and below them
_BREAKOUT_PADDLE_ROW = 76
_BREAKOUT_NOOP, _BREAKOUT_FIRE, _BREAKOUT_RIGHT, _BREAKOUT_LEFT = 0, 1, 2, 3
# How far (in columns) the predicted landing may be from where the paddle would coast to before it moves, and how
# much of its last step the paddle is expected to coast on: the joystick turns ALE's paddle knob, which moves the
# paddle over two or three steps after each press (benchmarks/atari.md, "The Breakout expert").
_BREAKOUT_DEAD_BAND = 6.0
_BREAKOUT_COASTING = 0.5


def _breakout_ball(frame: np.ndarray) -> tuple[float, float] | None:
    left, right = _BREAKOUT_FIELD_COLUMNS
    for top, bottom in _BREAKOUT_BALL_ROWS:
        rows, columns = np.nonzero(frame[top:bottom, left:right])
        if len(rows):
            return rows.mean() + top, columns.mean() + left
    return None


def _breakout_paddle(frame: np.ndarray) -> float | None:
    left, right = _BREAKOUT_FIELD_COLUMNS
    columns = np.nonzero(frame[_BREAKOUT_PADDLE_ROW, left:right])[0]
    return (columns.min() + columns.max()) / 2 + left if len(columns) else None


def _breakout_landing(before: np.ndarray, now: np.ndarray) -> float | None:
    """The column at which the falling ball reaches the paddle's row, bouncing off the side walls; where the ball is
    while it rises; None when no ball is in sight."""
    ball, previous = _breakout_ball(now), _breakout_ball(before)
    if ball is None:
        return None
    if previous is None or ball[0] <= previous[0]:
        return ball[1]
    row_speed, column_speed = ball[0] - previous[0], ball[1] - previous[1]
    column = ball[1] + column_speed * (_BREAKOUT_PADDLE_ROW - 1 - ball[0]) / row_speed
    left, right = _BREAKOUT_FIELD_COLUMNS
    return _between_walls(column, left, right - left - 2)


def _breakout_one(stack: np.ndarray) -> int:
    _check_stack("breakout", stack)
    paddle, previous = _breakout_paddle(stack[-1]), _breakout_paddle(stack[-2])
    target = _breakout_landing(stack[-2], stack[-1])
    if paddle is None or target is None:  # no ball in play (or it is among the bricks): FIRE serves the next one
        return _BREAKOUT_FIRE
    coasting = paddle + _BREAKOUT_COASTING * (0.0 if previous is None else paddle - previous)
    if target > coasting + _BREAKOUT_DEAD_BAND:
        return _BREAKOUT_RIGHT
    if target < coasting - _BREAKOUT_DEAD_BAND:
        return _BREAKOUT_LEFT
    return _BREAKOUT_NOOP


def breakout(obs: np.ndarray) -> np.ndarray:
    """ALE/Breakout-v5 with AtariPreprocessing and FrameStackObservation(4): reads the ball and the paddle from the
    last two frames, predicts where a falling ball will reach the paddle's row (bouncing off the side walls), follows
    a rising one, and serves with FIRE when no ball is in play."""
    return np.array([_breakout_one(o) for o in obs])
