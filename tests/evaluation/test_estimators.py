"""The off-policy estimators on logged episodes whose true values are known exactly.

The synthetic task: episodes of HORIZON steps cut by the time limit, random 2-d observations, two actions;
action 0 earns 1, action 1 earns 0, whatever the state. Logged by a uniformly random behaviour policy, so a
policy taking action 0 with probability p is worth p * HORIZON.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

import dataset_format as dataset
from common.errors import UserError
from common.observations import ModelInput
from dataset_format import Col
from evaluation.config import FQE, MODEL, OPEConfig
from evaluation.estimators import (
    Episodes,
    FitReport,
    Weighted,
    bootstrap,
    fit_fqe,
    log_ratios,
    resampling_members,
)
from evaluation.ope_validation import (
    KEPT_BEHAVIOUR,
    markdown,
    regret_at_1,
    selection_markdown,
    spearman,
    validate,
    validate_selection,
    with_rule_points,
)
from evaluation.selection import Interval, agreed
from tests.conftest import write_frame_stacks

HORIZON = 8
CONFIG = OPEConfig(hidden_layers=[32, 32], iterations=HORIZON + 4, updates_per_iteration=100, batch_size=128,
                   bootstrap_samples=100)


VECTORS = ModelInput((2,))  # the 2-d observations, as they are


def logged_episodes(episodes: int, behaviour_p0: float = 0.5, seed: int = 0) -> Episodes:
    rng = np.random.default_rng(seed)
    n = episodes * HORIZON
    obs = rng.normal(size=(n + episodes, 2)).astype(np.float32)
    first = np.arange(n) + np.repeat(np.arange(episodes), HORIZON)  # each episode has HORIZON + 1 observations
    actions = (rng.random(n) >= behaviour_p0).astype(np.int64)
    t = np.tile(np.arange(HORIZON, dtype=np.int32), episodes)
    return Episodes.of({
        Col.EPS_ID: np.repeat(np.arange(episodes, dtype=np.int64), HORIZON), Col.T: t,
        Col.OBS: obs[first], Col.NEW_OBS: obs[first + 1], Col.ACTIONS: actions,
        Col.REWARDS: (actions == 0).astype(np.float32),
        Col.TERMINATEDS: np.zeros(n, dtype=bool), Col.TRUNCATEDS: t == HORIZON - 1,
        Col.ACTION_LOGP: np.log(np.where(actions == 0, behaviour_p0, 1 - behaviour_p0)).astype(np.float32),
    })


def policy(p0: float, rows: int) -> np.ndarray:
    return np.tile([p0, 1 - p0], (rows, 1))


def estimates(episodes: Episodes, p0: float, config: OPEConfig = CONFIG) -> dict[str, float]:
    a = episodes.arrays
    q = fit_fqe(episodes, policy(p0, len(a[Col.T])), 2, HORIZON, config, lambda *_: None, VECTORS)
    pi = policy(p0, len(a[Col.T]))
    v = q.values(a[Col.OBS], a[Col.T], pi).mean(axis=1)  # the heads' mean, as `orl ope` takes it
    weighted = Weighted.of(episodes, log_ratios(episodes, pi), q.q(a[Col.OBS], a[Col.T], a[Col.ACTIONS]).mean(axis=1),
                           v, config.gamma)
    return {"fqe": float(v[episodes.starts].mean()), "wpdis": weighted.wpdis(), "wdr": weighted.wdr()}


@pytest.mark.parametrize("p0", [1.0, 0.5, 0.0])
def test_each_estimator_recovers_the_value_of_deterministic_and_stochastic_policies(p0):
    found = estimates(logged_episodes(300), p0)
    for name, value in found.items():
        assert value == pytest.approx(p0 * HORIZON, abs=0.4), (name, found)


def test_importance_weights_follow_the_logged_and_target_probabilities():
    episodes = logged_episodes(4, behaviour_p0=0.8)
    ratios = log_ratios(episodes, policy(1.0, len(episodes.arrays[Col.T])))
    took_0 = episodes.arrays[Col.ACTIONS] == 0
    assert np.allclose(ratios[took_0], -math.log(0.8))  # pi = 1, mu = 0.8
    assert np.all(np.isneginf(ratios[~took_0]))  # the target never takes action 1


def test_weighted_estimators_fall_back_when_no_episode_follows_the_target():
    """Logged actions the target never takes: importance sampling has nothing to weigh (0); doubly robust keeps
    the model's value."""
    episodes = logged_episodes(20, behaviour_p0=0.0)  # always action 1
    a = episodes.arrays
    n = len(a[Col.T])
    model_v = np.full(n, 3.0)
    weighted = Weighted.of(episodes, log_ratios(episodes, policy(1.0, n)), np.zeros(n), model_v, 1.0)
    assert weighted.wpdis() == 0.0 and weighted.effective_episodes() == 0.0
    assert weighted.wdr() == pytest.approx(3.0)  # the first state's modelled value


def test_fqe_stays_within_the_returns_the_rewards_allow_for_actions_the_data_never_shows():
    """All logged actions are 0; the target takes 1, whose value the data cannot tell. Bootstrapped targets are
    held within [min reward, max reward x steps left], so the estimate cannot run away."""
    episodes = logged_episodes(50, behaviour_p0=1.0)
    a = episodes.arrays
    q = fit_fqe(episodes, policy(0.0, len(a[Col.T])), 2, HORIZON, CONFIG, lambda *_: None, VECTORS)
    v = q.values(a[Col.OBS], a[Col.T], policy(0.0, len(a[Col.T])))
    assert np.all(v >= 0.0) and np.all(v <= (HORIZON - a[Col.T])[:, None] + 1e-4)  # each head's


def test_fqe_is_seeded_and_reports_its_progress():
    episodes = logged_episodes(30)
    lines = []
    config = OPEConfig(hidden_layers=[8], iterations=5, updates_per_iteration=3, batch_size=16)
    first = estimates(episodes, 0.5, config)
    fit_fqe(episodes, policy(0.5, len(episodes.arrays[Col.T])), 2, HORIZON, config,
            lambda *args: lines.append(args), VECTORS)
    assert first == estimates(episodes, 0.5, config)
    assert [line[:2] for line in lines] == [(i, 5) for i in range(1, 6)] and all(line[2] >= 0 for line in lines)


def test_bootstrap_interval_brackets_the_estimate_and_narrows_with_more_episodes():
    def interval(values):
        return bootstrap(lambda sample: float(values[sample].mean()), len(values), CONFIG)

    rng = np.random.default_rng(0)
    few, many = rng.normal(5, 1, size=20), rng.normal(5, 1, size=2000)
    (low_few, high_few), (low_many, high_many) = interval(few), interval(many)
    assert low_few <= few.mean() <= high_few and low_many <= many.mean() <= high_many
    assert high_many - low_many < (high_few - low_few) / 4


def test_fqe_heads_fit_their_own_resamples_of_the_episodes():
    """Each head sees the episodes by its own Poisson(1) weights: the heads are fits of different data, which
    disagree, and their mean estimates the value; one head is one plain fit."""
    episodes = logged_episodes(20)
    a = episodes.arrays
    pi = policy(0.5, len(a[Col.T]))
    starts = [fit_fqe(episodes, pi, 2, HORIZON, dataclasses.replace(CONFIG, fqe_heads=heads), lambda *_: None,
                      VECTORS).values(a[Col.OBS], a[Col.T], pi)[episodes.starts] for heads in (1, 5)]
    assert [values.shape for values in starts] == [(20, 1), (20, 5)]
    heads_means = starts[1].mean(axis=0)
    assert heads_means.std() > 0.005 and heads_means.mean() == pytest.approx(0.5 * HORIZON, abs=0.6)


def test_an_ensembles_interval_includes_its_members_spread():
    """Members that agree on every episode's ordering but not on the level: resampling episodes alone would give an
    interval of about nothing; resampling members with them gives their spread."""
    rng = np.random.default_rng(0)
    values = np.linspace(3.0, 5.0, 5)[None, :] + rng.normal(0, 0.01, size=(200, 1))  # (episodes, members)
    low, high = bootstrap(resampling_members(values, seed=0), len(values), CONFIG)
    only_episodes = bootstrap(lambda sample: float(values[sample].mean()), len(values), CONFIG)
    assert only_episodes[1] - only_episodes[0] < 0.01 and high - low > 0.5 and low < values.mean() < high


def test_select_keeps_whole_episodes_in_the_order_given():
    episodes = logged_episodes(5)
    chosen = episodes.select(np.array([3, 1]))
    assert len(chosen) == 2 and list(chosen.lengths) == [HORIZON, HORIZON]
    assert list(np.unique(chosen.arrays[Col.EPS_ID])) == [1, 3] and chosen.arrays[Col.EPS_ID][0] == 3


def test_validation_metrics():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([3, 2, 1], [10, 20, 30]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [10, 20, 30]) == 0.0  # estimates that rank nothing
    assert regret_at_1([0.0, 5.0, 1.0], [100.0, 50.0, 80.0]) == 1.0  # picked the worst
    assert regret_at_1([0.0, 1.0, 5.0], [100.0, 50.0, 80.0]) == pytest.approx(0.4)  # 80 of 50..100
    assert regret_at_1([9.0, 5.0, 1.0], [100.0, 50.0, 80.0]) == 0.0
    assert regret_at_1([3.0, 1.0], [-10.0, -50.0]) == 0.0 and regret_at_1([1.0, 3.0], [-10.0, -50.0]) == 1.0
    # Tied at the top (estimates held at a bound): a pick among them at random, whichever comes first.
    assert regret_at_1([5.0, 5.0, 1.0], [100.0, 50.0, 80.0]) == pytest.approx(0.5)
    assert regret_at_1([5.0, 5.0, 1.0], [50.0, 100.0, 80.0]) == pytest.approx(0.5)
    points = [{"dataset": d, "estimator": "fqe", "estimate": e, "truth": t}
              for d, e, t in [("a", 1, 10), ("a", 2, 20), ("b", 5, 40), ("b", 4, 30)]]
    summary = validate(points)["fqe"]
    assert summary["policies"] == 4 and summary["datasets"]["a"]["spearman"] == pytest.approx(1.0)
    assert summary["datasets"]["b"]["regret_at_1"] == 0.0 and summary["median_regret_at_1"] == 0.0
    assert summary["mae"] == pytest.approx((9 + 18 + 35 + 26) / 4)


def point(dataset: str, run: str, estimate: float, low: float, high: float, truth: float,
          estimator: str = FQE) -> dict:
    """A run's estimate with its interval and true score, as the selection's validation takes them."""
    return {"dataset": dataset, "estimator": estimator, "run": run, "estimate": estimate, "ci_low": low,
            "ci_high": high, "truth": truth}


def test_the_selection_rule_is_validated_by_what_it_keeps():
    """`orl select`'s rule keeps the run with the highest lower bound where it stands above the behaviour policy's
    interval, else the behaviour policy; its regret counts the behaviour policy among the choices."""
    points = [point("a", "dqn", 60, 10, 110, 20), point("a", "iql", 40, 35, 45, 50),  # dqn: high, but unsure
              point("b", "bc", 95, 90, 99, 90),  # within the behaviour's interval
              point("c", "bc", 50, 40, 60, 10)]  # sure of itself, and wrong
    behaviours = {"a": (Interval(0, -5, 5), 0.0), "b": (Interval(99, 98, 100), 100.0),
                  "c": (Interval(30, 25, 35), 30.0)}
    # Every estimated run counts among the choices, also one the estimator gave no number (marwil: out of range).
    truths = {"a": {"dqn": 20, "iql": 50, "marwil": 60}, "b": {"bc": 90}, "c": {"bc": 10}}
    summary = validate_selection(points, behaviours, truths)["fqe"]
    a, b, c = (summary["datasets"][name] for name in "abc")
    assert (a["kept"], a["best"], a["worse_than_behaviour"]) == ("iql", "marwil", False)
    assert a["regret"] == pytest.approx(10 / 60)  # 50 of 0 (the behaviour policy) .. 60
    assert regret_at_1([60, 40], [20, 50]) == 1.0  # the highest estimate alone would have kept dqn
    assert (b["kept"], b["kept_truth"], b["regret"]) == (KEPT_BEHAVIOUR, 100.0, 0.0)
    assert (c["kept"], c["regret"], c["worse_than_behaviour"]) == ("bc", 1.0, True)
    assert summary["median_regret"] == pytest.approx(10 / 60) and summary["worse_than_behaviour"] == 1
    table = selection_markdown({"fqe": summary})
    assert "| fqe | a | iql | 50.0 | marwil (60.0) | 0.17 |" in table
    assert f"| fqe | b | {KEPT_BEHAVIOUR} | 100.0 | {KEPT_BEHAVIOUR} (100.0) | 0.00 |" in table


def test_by_fqe_and_the_model_together_the_rule_keeps_only_what_both_put_above_the_behaviour_policy():
    """As `orl select --by fqe model` picks: each run at its lowest lower bound among the estimators, and passed over
    where one of them gave no number (`with_rule_points` makes the points the rule reads). FQE alone keeps the runs it
    over-values; both together keep the run both put above the behaviour policy, or the behaviour policy where none
    stands above by both."""
    points = [point("a", "dqn", 80, 75, 85, 15), point("a", "dqn", 10, 5, 15, 15, MODEL),
              point("a", "iql", 60, 55, 65, 55), point("a", "iql", 50, 45, 55, 55, MODEL),
              point("a", "marwil", 90, 88, 92, 5),  # the model-based estimate out of range
              point("b", "bc", 70, 65, 75, 20), point("b", "bc", 20, 15, 25, 20, MODEL)]
    behaviours = {name: (Interval(30, 25, 35), 30.0) for name in "ab"}
    truths = {"a": {"dqn": 15, "iql": 55, "marwil": 5}, "b": {"bc": 20}}

    points = with_rule_points(points, together=(FQE, MODEL))
    summary = validate_selection(points, behaviours, truths)

    assert list(summary) == [FQE, MODEL, "fqe+model"]
    # Validated as an estimator too, at the lower estimate, on the runs both estimated (not marwil).
    rule = validate(points)["fqe+model"]
    assert rule["policies"] == 3 and rule["mae"] == pytest.approx((5 + 5 + 0) / 3)
    assert rule["datasets"]["a"]["spearman"] == pytest.approx(1.0) and rule["datasets"]["a"]["regret_at_1"] == 0.0
    assert [summary[FQE]["datasets"][name]["kept"] for name in "ab"] == ["marwil", "bc"]
    assert summary[FQE]["worse_than_behaviour"] == 2
    assert [summary["fqe+model"]["datasets"][name]["kept"] for name in "ab"] == ["iql", KEPT_BEHAVIOUR]
    assert summary["fqe+model"]["worse_than_behaviour"] == 0 and summary["fqe+model"]["median_regret"] == 0.0
    assert agreed([Interval(80, 75, 85), Interval(10, 5, 15)]) == Interval(10, 5, 85)
    assert not agreed([Interval(80, 75, 85), Interval(math.nan, math.nan, math.nan)]).finite


def test_validation_of_policies_that_all_score_the_same_says_so_instead_of_nan():
    points = [{"dataset": "all-100", "estimator": "fqe", "estimate": e, "truth": 100.0} for e in (90.0, 95.0, 99.0)]
    summary = validate(points)["fqe"]
    assert summary["datasets"]["all-100"]["spearman"] is None and summary["datasets"]["all-100"]["regret_at_1"] is None
    assert summary["median_regret_at_1"] is None
    table = markdown({"fqe": summary})
    assert "| fqe | all-100 | 3 | n/a (all equal) | n/a (all equal) | 5.3 |" in table and "nan" not in table


def test_a_fit_whose_td_loss_ends_above_the_returns_variance_did_not_converge():
    assert FitReport(td_loss_start=50.0, td_loss=5.0, td_loss_limit=100.0).converged
    assert not FitReport(td_loss_start=50.0, td_loss=6.0e5, td_loss_limit=2.2e3).converged
    assert not FitReport(td_loss_start=50.0, td_loss=math.nan, td_loss_limit=2.2e3).converged


def test_fqe_reports_its_td_loss_falling_and_the_returns_the_data_allows():
    episodes = logged_episodes(100)
    q = fit_fqe(episodes, policy(0.5, len(episodes.arrays[Col.T])), 2, HORIZON, CONFIG, lambda *_: None, VECTORS)
    assert q.fit.converged and q.fit.td_loss < q.fit.td_loss_start
    assert q.fit.td_loss_limit == pytest.approx(np.var(episodes.returns_to_go(1.0)))
    low, high = q.return_range()
    returns = episodes.returns_to_go(1.0)[episodes.starts]
    assert low <= returns.min() and high >= returns.max() and high <= HORIZON


def test_fqe_on_data_without_reward_values_every_policy_at_zero_and_converges():
    # All-zero rewards leave the returns-to-go no variance to hold the TD loss under; the bounds hold Q at 0.
    a = dict(logged_episodes(100).arrays)
    a[Col.REWARDS] = np.zeros_like(a[Col.REWARDS])
    episodes = Episodes.of(a)
    q = fit_fqe(episodes, policy(0.5, len(a[Col.T])), 2, HORIZON, CONFIG, lambda *_: None, VECTORS)
    assert q.fit.converged and q.fit.td_loss_limit == 0
    assert not q.values(a[Col.OBS], a[Col.T], policy(0.5, len(a[Col.T]))).any()


def test_returns_to_go_sum_each_episodes_rewards_from_each_step():
    episodes = Episodes.of({Col.EPS_ID: np.array([7, 7, 7, 2]), Col.REWARDS: np.array([1.0, 2.0, 4.0, 5.0])})
    assert episodes.returns_to_go(1.0).tolist() == [7.0, 6.0, 4.0, 5.0]
    assert episodes.returns_to_go(0.5).tolist() == [1 + 1 + 1, 2 + 2, 4.0, 5.0]


@pytest.mark.slow  # 100 LunarLander episodes, then 300 FQE iterations (about 40 s)
def test_fqe_on_lunar_lander_rewards_converges_within_the_returns_the_data_allows():
    """Rewards in the hundreds (a crash, -100; a leg touching down, +10 or more), logged by gymnasium's heuristic
    lander with 40 % random actions, and a greedy target that disagrees with the logged action at most states.
    Before values were held within the logged returns-to-go, the TD loss of this fit grew from 3.8e3 to 3.8e4 and
    FQE estimated a return of 528 where the best logged episode returned 172 (issue 44)."""
    import gymnasium as gym

    from examples.controllers import lunar_lander

    env, rng = gym.make("LunarLander-v3"), np.random.default_rng(0)
    rows = {name: [] for name in (Col.EPS_ID, Col.T, Col.OBS, Col.NEW_OBS, Col.ACTIONS, Col.REWARDS,
                                   Col.TERMINATEDS, Col.TRUNCATEDS)}
    for episode in range(100):
        obs, _ = env.reset(seed=episode)
        t, done = 0, False
        while not done:
            action = int(rng.integers(4)) if rng.random() < 0.4 else int(lunar_lander(obs[None])[0])
            new_obs, reward, terminated, truncated, _ = env.step(action)
            for name, value in zip(rows, (episode, t, obs, new_obs, action, reward, terminated, truncated)):
                rows[name].append(value)
            obs, t, done = new_obs, t + 1, terminated or truncated
    episodes = Episodes.of({name: np.array(values) for name, values in rows.items()})
    a = episodes.arrays
    weights = np.random.default_rng(1).normal(size=(8, 4))

    def target(obs):
        return np.eye(4)[np.argmax(obs @ weights, axis=1)]

    losses = []
    q = fit_fqe(episodes, target(a[Col.NEW_OBS]), 4, 1000, OPEConfig(iterations=300),
                lambda i, n, loss: losses.append(loss), ModelInput((8,)))
    starts = episodes.starts
    estimate = q.values(a[Col.OBS][starts], a[Col.T][starts], target(a[Col.OBS][starts])).mean()
    returns = episodes.returns_to_go(1.0)
    assert q.fit.converged and q.fit.td_loss < q.fit.td_loss_start / 4, q.fit
    assert returns.min() <= estimate <= returns.max()
    assert max(losses[-30:]) < 10 * q.fit.td_loss_start  # no late blow-up


def test_fqe_on_continuous_actions_values_the_action_the_policy_takes():
    """Box actions in [-1, 1] earning -(a - 0.5)^2: a policy always acting `c` is worth -HORIZON (c - 0.5)^2."""
    episodes = logged_episodes(300)
    a = dict(episodes.arrays)
    rng = np.random.default_rng(1)
    a[Col.ACTIONS] = rng.uniform(-1, 1, size=(len(a[Col.T]), 1)).astype(np.float32)
    a[Col.REWARDS] = -np.square(a[Col.ACTIONS][:, 0] - 0.5).astype(np.float32)
    episodes = Episodes.of(a)
    for c in (0.5, -0.5):
        acting = np.full((len(a[Col.T]), 1), c, dtype=np.float32)
        q = fit_fqe(episodes, acting, None, HORIZON, CONFIG, lambda *_: None, VECTORS)
        value = q.values(a[Col.OBS], a[Col.T], acting)[episodes.starts].mean()
        assert value == pytest.approx(-HORIZON * (c - 0.5) ** 2, rel=0.12, abs=0.3), c


@pytest.mark.slow  # a CNN's fit on CPU
def test_fqe_reads_image_observations_through_a_cnn():
    """Channels-first uint8 frames (a FrameStackObservation layout) whose first pixel tells which action pays:
    a policy that reads it is worth HORIZON, and only a network that sees the frames can tell."""
    episodes = logged_episodes(200)
    a = dict(episodes.arrays)
    frames = np.zeros((len(a[Col.T]), 2, 12, 12), dtype=np.uint8)
    frames[:, :, :4, :4] = np.where(a[Col.OBS][:, 0] > 0, 255, 0)[:, None, None, None]
    pays = (a[Col.OBS][:, 0] > 0).astype(np.int64)  # action 1 pays where the corner is lit, action 0 elsewhere
    a.update({Col.OBS: frames, Col.NEW_OBS: frames, Col.REWARDS: (a[Col.ACTIONS] == pays).astype(np.float32)})
    episodes = Episodes.of(a)
    config = dataclasses.replace(CONFIG, conv_filters=[[8, 4, 2], [8, 3, 1]])
    observations = ModelInput((2, 12, 12), channels_first=True, scale=1 / 255)
    reading = np.eye(2)[pays]  # the same frame follows: the policy's next action reads it too
    q = fit_fqe(episodes, reading, 2, HORIZON, config, lambda *_: None, observations)
    assert isinstance(q.net.encoder[0], torch.nn.Conv2d)
    value = q.values(frames, a[Col.T], reading)[episodes.starts].mean()
    assert value == pytest.approx(HORIZON, abs=0.8)
    with pytest.raises(UserError, match=r"ope.conv_filters \[\[8, 8, 4\], \[8, 4, 2\]\] leave no pixels of a 12x12 image"):
        fit_fqe(episodes, reading, 2, HORIZON, dataclasses.replace(CONFIG, conv_filters=[[8, 8, 4], [8, 4, 2]]),
                lambda *_: None, observations)


def test_fqe_on_frames_held_once_fits_and_values_as_on_the_arrays(tmp_path):
    """Frame stacks held once per distinct frame (`load_frame_arrays`, as `orl ope` reads image datasets) give FQE
    the inputs the arrays give, through a selection of episodes: the same fit and the same values."""
    path = write_frame_stacks(tmp_path / "stacks")
    observations = ModelInput((4, 12, 10), channels_first=True, scale=1 / 255)
    config = dataclasses.replace(CONFIG, conv_filters=[[4, 3, 2]], iterations=3, updates_per_iteration=5, batch_size=8)
    values = []
    for arrays in (dataset.load_arrays(path), dataset.load_frame_arrays(path, channels_first=True)):
        episodes = Episodes.of(arrays).select(np.array([2, 0]))
        a = episodes.arrays
        uniform = np.full((len(a[Col.T]), 3), 1 / 3)
        q = fit_fqe(episodes, uniform, 3, 9, config, lambda *_: None, observations)
        values.append(q.values(a[Col.OBS], a[Col.T], uniform))
    assert isinstance(episodes.arrays[Col.OBS], dataset.StackedObservations)
    np.testing.assert_array_equal(values[0], values[1])
