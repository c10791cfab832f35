"""The model-based estimator on logged episodes whose true values are known exactly.

The synthetic task: a 1-d position starts in [0, 2) and moves 1 per step with action 0, 1.5 with action 1; every
step earns 1, and the episode ends once the position reaches 6. A policy's return from a start is its number of
steps to the end, which only a model that learned the moves and where episodes end can tell.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from common.errors import UserError
from dataset_format import Col, read_card
from evaluation.config import MODEL, OPEConfig
from evaluation.estimators import Episodes
from evaluation.model_based import dynamics_updates, fit_dynamics, rollout_returns
from evaluation.ope import undefined_estimators
from tests.conftest import write_frame_stacks

END, MOVES = 6.0, (1.0, 1.5)
CONFIG = OPEConfig(model_hidden_layers=[64, 64], model_ensemble=2, model_updates=1500, batch_size=128)


def logged_episodes(episodes: int, seed: int = 0) -> Episodes:
    """Episodes of a uniformly random behaviour policy."""
    rng = np.random.default_rng(seed)
    steps = []
    for episode in range(episodes):
        position, t = rng.uniform(0, 2), 0
        while position < END:
            action = int(rng.integers(2))
            moved = position + MOVES[action]
            steps.append((episode, t, position, action, moved, moved >= END))
            position, t = moved, t + 1
    return episodes_of(steps)


def episodes_of(steps: list[tuple], ending_reward: float = 1.0) -> Episodes:
    """Episodes from (eps_id, t, position, action, next position, terminated) per step, every step earning 1 but a
    step that terminates, which earns `ending_reward`."""
    eps_id, t, obs, actions, new_obs, terminateds = (np.array(column) for column in zip(*steps))
    return Episodes.of({Col.EPS_ID: eps_id, Col.T: t, Col.OBS: obs[:, None].astype(np.float32), Col.ACTIONS: actions,
                        Col.REWARDS: np.where(terminateds, ending_reward, 1.0),
                        Col.NEW_OBS: new_obs[:, None].astype(np.float32),
                        Col.TERMINATEDS: terminateds, Col.TRUNCATEDS: np.zeros(len(t), dtype=bool)})


def steps_to_end(start: float, action: int) -> int:
    return int(np.ceil((END - start) / MOVES[action]))


def test_rollouts_in_the_learned_dynamics_give_each_policys_steps_to_the_end():
    episodes = logged_episodes(300)
    model = fit_dynamics(episodes, 2, CONFIG, lambda *_: None)
    starts = np.array([[0.25], [0.9], [1.7]], dtype=np.float32)
    for action in (0, 1):
        returns, halted = rollout_returns(model, lambda obs, a=action: np.full(len(obs), a), starts, horizon=50,
                                          gamma=1.0)
        assert returns.shape == (3, CONFIG.model_ensemble)
        truth = [steps_to_end(float(s), action) for s in starts[:, 0]]
        np.testing.assert_allclose(returns.mean(axis=1), truth, atol=0.6)
        # Every move the policies make, the data shows: only the small chance of going on past the end halts
        assert halted.max() < 0.05
    assert model.return_range(50) == (0.0, 50.0)  # rewards of 1: up to the horizon's steps


def test_networks_fitted_on_unrolled_stretches_still_give_each_policys_steps_to_the_end():
    config = dataclasses.replace(CONFIG, model_unroll_steps=3, model_unroll_updates=500)
    episodes = logged_episodes(300)
    for column in episodes.arrays.values():
        column.flags.writeable = False  # as columns read from Parquet are
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = fit_dynamics(episodes, 2, config, lambda *_: None)
    starts = np.array([[0.25], [0.9], [1.7]], dtype=np.float32)
    for action in (0, 1):
        returns, _ = rollout_returns(model, lambda obs, a=action: np.full(len(obs), a), starts, horizon=50,
                                     gamma=1.0)
        np.testing.assert_allclose(returns.mean(axis=1), [steps_to_end(float(s), action) for s in starts[:, 0]],
                                   atol=0.6)


def test_unrolling_more_steps_than_any_episode_goes_on_is_refused_in_one_line():
    episodes = logged_episodes(20)  # every episode ends within 6 steps
    with pytest.raises(UserError, match="ope.model_unroll_steps 7: no logged episode goes on for that many steps"):
        fit_dynamics(episodes, 2, dataclasses.replace(CONFIG, model_unroll_steps=7), lambda *_: None)


def test_a_step_past_the_end_surely_terminates_and_its_state_is_held_within_the_logged_ones():
    model = fit_dynamics(logged_episodes(300), 2, CONFIG, lambda *_: None)
    obs, actions = np.array([[1.0], [4.0], [5.5]], dtype=np.float32), np.ones(3, dtype=np.int64)
    next_obs, _, ends, _ = model.step(model.outputs(obs, actions)[0], obs, model.ending(obs, actions))
    np.testing.assert_allclose(ends, [0, 0, 1], atol=0.05)  # 2.5, 5.5 and 7.0: the last past the end
    assert next_obs.max() <= model.obs_high.max()


def uncertain_endings(ending_reward: float, ending_state: float | None) -> Episodes:
    """Positions drawn at random in [0, 1), where any step ends the episode one time in five, earning
    `ending_reward` (1 as every other step) and landing at `ending_state` (None: at random as the others)."""
    rng = np.random.default_rng(0)
    steps, episode, t = [], 0, 0
    while episode < 1000:
        end = bool(rng.random() < 0.2)
        next_state = ending_state if end and ending_state is not None else rng.random()
        steps.append((episode, t, rng.random(), int(rng.integers(2)), next_state, end))
        episode, t = (episode + 1, 0) if end else (episode, t + 1)
    return episodes_of(steps, ending_reward)


@pytest.mark.parametrize("ending_reward,ending_state,expected", [
    # A cut at even odds would never end a rollout, and give the horizon's 50
    (1.0, None, 5.0),
    # A crash: far from every state that goes on, and its own reward. Five steps expected, each worth
    # 0.8 * 1 + 0.2 * 6; a model of the mean step would move every state towards the crash, and end it there
    (6.0, 10.0, 10.0),
])
def test_an_ending_the_data_shows_as_uncertain_counts_at_its_chance_with_its_own_reward(ending_reward, ending_state,
                                                                                        expected):
    model = fit_dynamics(uncertain_endings(ending_reward, ending_state), 2, CONFIG, lambda *_: None)
    returns, halted = rollout_returns(model, lambda obs: np.zeros(len(obs), dtype=np.int64),
                                      np.full((1, 1), 0.5, np.float32), horizon=50, gamma=1.0)
    assert not halted.any()
    np.testing.assert_allclose(returns, expected, rtol=0.15)


def test_data_where_no_episode_ends_gives_endings_no_chance_and_no_warning():
    """Every episode cut by its time limit (expert CartPole, Pendulum): there is no ending to model."""
    steps = [(episode, t, t / 10, t % 2, (t + 1) / 10, False) for episode in range(20) for t in range(10)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = fit_dynamics(episodes_of(steps), 2, dataclasses.replace(CONFIG, model_updates=10), lambda *_: None)
        chance, _ = model.ending(np.zeros((3, 1), np.float32), np.zeros(3, dtype=np.int64))
    np.testing.assert_array_equal(chance, 0)


def test_a_rollout_stops_at_the_horizon_and_discounts():
    model = fit_dynamics(logged_episodes(50), 2, dataclasses.replace(CONFIG, model_updates=10), lambda *_: None)
    returns, _ = rollout_returns(model, lambda obs: np.zeros(len(obs), dtype=np.int64), np.zeros((1, 1), np.float32),
                                 horizon=2, gamma=0.5)
    assert returns.max() <= 1.0 + 0.5 + 1e-6  # two steps of reward 1 at most, the second discounted


def test_a_rollout_halts_where_the_networks_part_more_than_on_any_logged_transition_that_goes_on():
    episodes = logged_episodes(100)
    model = fit_dynamics(episodes, 2, dataclasses.replace(CONFIG, model_updates=200), lambda *_: None)
    a = episodes.arrays
    goes_on = model.goes_on  # the transitions the networks are fitted on
    logged = model.disagreement(model.outputs(a[Col.OBS][goes_on], a[Col.ACTIONS][goes_on]))
    assert model.disagreement_limit == pytest.approx(logged.max())  # quantile 1: the largest among them
    # The lowest return-to-go logged at each step: the steps left in the episode that ends soonest after it
    lengths = episodes.lengths
    assert [model.halt_value(t) for t in range(lengths.max())] == [(lengths[lengths > t] - t).min()
                                                                    for t in range(lengths.max())]
    assert model.halt_value(lengths.max()) == 1.0  # past every logged episode: the lowest of all, a last step's 1

    starts, act = np.array([[0.5], [1.0]], dtype=np.float32), lambda obs: np.ones(len(obs), dtype=np.int64)
    model.disagreement_limit = logged.min() / 2  # as if the networks parted everywhere: each rollout halts at once
    returns, halted = rollout_returns(model, act, starts, horizon=50, gamma=0.5)
    # The halt's value at step 0, the shortest episode, for all but the first step's small chance of ending
    np.testing.assert_allclose(halted, 1, atol=1e-3)
    np.testing.assert_allclose(returns, lengths.min(), rtol=1e-3)


def test_a_rollout_halts_where_its_state_leaves_the_logged_range_by_the_margin():
    episodes = logged_episodes(100)
    model = fit_dynamics(episodes, 2, dataclasses.replace(CONFIG, model_updates=200, model_halt_margin=0.1),
                         lambda *_: None)
    positions = episodes.arrays[Col.OBS]
    low, high = positions.min(axis=0), positions.max(axis=0)
    np.testing.assert_allclose(model.halt_low, low - 0.1 * (high - low))
    np.testing.assert_allclose(model.halt_high, high + 0.1 * (high - low))

    model.halt_high = np.array([3.0], dtype=np.float32)  # as if no logged position were above 3
    returns, halted = rollout_returns(model, lambda obs: np.ones(len(obs), dtype=np.int64),
                                      np.array([[0.5]], dtype=np.float32), horizon=50, gamma=0.5)
    # Moves of 1.5 from 0.5 reach 3.5 at the second step: two rewards, then the lowest return-to-go logged at step 2
    np.testing.assert_allclose(halted, 1, atol=1e-2)
    np.testing.assert_allclose(returns, 1 + 0.5 + 0.25 * model.halt_value(2), rtol=1e-2)


def test_the_model_based_estimator_takes_vector_observations_only(tmp_path):
    card = read_card(write_frame_stacks(tmp_path / "stacks"))
    assert "learns the dynamics of vector observations, and stacks's are images; use fqe" in (
        undefined_estimators(card)[MODEL])


def test_each_network_passes_over_a_large_dataset_model_epochs_times():
    config = OPEConfig(model_updates=2000, model_epochs=5, batch_size=256)
    assert dynamics_updates(50_000, config) == 2000  # model_updates already passes over it about 10 times
    assert dynamics_updates(900_000, config) == 17_579  # 5 passes of 256-transition batches, rounded up


@pytest.mark.parametrize("field,value", [("model_ensemble", 0), ("model_updates", 0), ("model_epochs", 0),
                                         ("model_hidden_layers", []), ("model_halt_quantile", 0),
                                         ("model_halt_quantile", 1.5), ("model_unroll_steps", 0),
                                         ("model_unroll_updates", 0), ("model_halt_margin", -0.1)])
def test_bad_model_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        OPEConfig(**{field: value})
