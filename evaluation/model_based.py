"""The model-based estimator (`model`): dynamics learned from the logged transitions, the policy rolled out in them.

An ensemble of networks each predicts, from a state and an action, the change to the state and the reward of a step
that does not end the episode; each is fitted on its own resample of those transitions (Fu et al. 2021, "Benchmarks for
Deep Off-Policy Evaluation", found such models among the strongest estimators). How episodes end has networks of its
own, since a step that ends one may jump where no other step goes (a lander's crash: a velocity's change and a -100
that the state before hardly tells, which a mean over all steps would smear over every step near the ground, measured
in benchmarks/ope.md):
- from the state and the action, the chance that the step ends the episode, and the reward it earns if it does;
- from the state reached, the chance that it is an ending: a function of that state in most tasks (a pole past its
  angle, a tip above the line, a hopper fallen), which a network learns more surely than composed with the dynamics.
Both tell the same ending, so a step ends at the larger of the two chances; its reward is the mean of the ending's
reward and the going-on one, weighed by the chance told from the state and the action. The policy acts in every network
from the first state of each episode estimated on, up to the horizon, and its return is the mean over episodes and
networks. Each step's reward counts at the rollout's chance of not having ended before it: an ending the data shows as
likely but not certain (a lander touching down fast) then ends a share of the rollouts, where a cut at even odds would
let them all fly on, earning rewards to the time limit (measured on LunarLander, benchmarks/ope.md).
Unlike FQE's values, held within the logged returns-to-go, a model's rollout can find a policy better than every logged
episode; it is held only within the logged states and rewards, step by step.

A rollout feeds each network its own predictions, step after step, and errors too small to see in one step compound:
on Hopper a network that predicts a walker's every step within a few percent of its standard deviation lets it fall
within 200 steps where the walker goes on for 1,000 (benchmarks/ope.md). `model_unroll_steps` > 1 then fits each
network, after its one-step fit, on stretches of logged steps unrolled from its own predictions (a multi-step loss, as
in Lambert et al. 2021, "Learning accurate long-term dynamics for model-based reinforcement learning").

Where the policy leads a rollout away from the data, the networks' guesses part: a rollout halts where they disagree
more than they do on all but `model_halt_quantile`'s share of the logged transitions that go on, and counts for the rest
of the share that goes on the lowest return-to-go logged at the same step of an episode, a pessimistic end as in MOReL's
pessimistic MDP (Kidambi et al. 2020). A model that only extrapolates there gives such a policy whatever value its
guesses add up to (on random CartPole data, far above the truth for the policies that balance longer than any logged
episode); the halt gives it the worst the data shows at that step, and the share of rollouts that halted says how far
the policy left the data. Networks that agree where they are wrong do not halt. With `model_halt_margin`, a rollout
also halts where a state it reaches lies outside the logged states' range by more than that share of it: held at the
range's edge instead, a lander the networks flew off the logged map hovers there, earning its penalties to the
horizon (benchmarks/ope.md).

Vector observations only: a model of images or of Discrete states would need another kind of network. And data
where some steps go on: of one-step episodes (a contextual bandit's), there are no dynamics to learn.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from common.errors import UserError
from dataset_format import Col
from evaluation.config import OPEConfig
from evaluation.estimators import Episodes, mlp

# Logged transitions the networks' disagreement is calibrated on: a quantile of a sample this size is steady.
CALIBRATION_ROWS = 50_000
# A rollout whose chance of not having ended falls below this stops: the rest of it would count for that little.
NEGLIGIBLE_CHANCE = 1e-3
# The multi-step fit (`model_unroll_steps`) refines networks the one-step fit has brought close, at this share of `lr`.
UNROLL_LR_SHARE = 0.3


class DynamicsEnsemble:
    """Networks over (state, action) features, normalized as fitted, that predict the state's change and the reward
    (normalized) of a step that goes on; over the same features, a network of the logit that the step ends the
    episode and one of the reward (normalized) if it does; and a network over next states, normalized, that
    predicts the logit of termination."""

    def __init__(self, episodes: Episodes, num_actions: int | None, gamma: float):
        a = episodes.arrays
        self.num_actions = num_actions
        self.networks: list[torch.nn.Module] = []  # fitted in fit_dynamics, as is termination
        self.termination: torch.nn.Module | None = None
        # From (state, action): the logit of ending, and the reward if it ends (normalized by the mean and the
        # standard deviation of the logged endings' rewards); None where no logged step ends an episode
        self.ending_chance: torch.nn.Module | None = None
        self.ending_reward: torch.nn.Module | None = None
        self.ending_reward_mean = self.ending_reward_std = None
        self.goes_on = ~np.asarray(a[Col.TERMINATEDS], dtype=bool)
        features, targets = self.features(a[Col.OBS], a[Col.ACTIONS]), _targets(a)[self.goes_on]
        self.feature_mean, self.feature_std = features.mean(axis=0), _std(features)
        self.target_mean, self.target_std = targets.mean(axis=0), _std(targets)
        next_obs = np.asarray(a[Col.NEW_OBS], dtype=np.float32)
        self.next_obs_mean, self.next_obs_std = next_obs.mean(axis=0), _std(next_obs)
        obs = np.asarray(a[Col.OBS], dtype=np.float32)
        self.obs_low, self.obs_high = obs.min(axis=0), obs.max(axis=0)
        self.reward_low, self.reward_high = float(a[Col.REWARDS].min()), float(a[Col.REWARDS].max())
        to_go = episodes.returns_to_go(gamma)
        # A halt at step t counts the lowest return-to-go logged at step t: pessimistic where logged episodes fail
        # early, not where they only run out of time (on expert data, every episode's last step earns 1).
        self.halt_values = np.full(episodes.lengths.max(), np.inf)
        np.minimum.at(self.halt_values, episodes.step_of_rows, to_go)
        self.halt_floor = float(to_go.min())  # past the longest logged episode
        self.disagreement_limit = np.inf  # set once the networks are fitted (fit_dynamics)
        self.halt_outside(None)  # fit_dynamics sets model_halt_margin's

    def __len__(self) -> int:
        return len(self.networks)

    def halt_outside(self, margin: float | None) -> None:
        """Rollouts halt where a state they reach lies outside the logged states' range by more than `margin` of it
        (None: never); `step` tells where one did."""
        if margin is None:
            self.halt_low, self.halt_high = np.full_like(self.obs_low, -np.inf), np.full_like(self.obs_high, np.inf)
        else:
            span = margin * (self.obs_high - self.obs_low)
            self.halt_low, self.halt_high = self.obs_low - span, self.obs_high + span

    def halt_value(self, step: int) -> float:
        """What a rollout halted at `step` counts for the rest: the lowest return-to-go logged at that step."""
        return float(self.halt_values[step]) if step < len(self.halt_values) else self.halt_floor

    def features(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        actions = (np.eye(self.num_actions, dtype=np.float32)[actions.astype(np.int64)] if self.num_actions
                   else np.asarray(actions, dtype=np.float32).reshape(len(actions), -1))
        return np.concatenate([np.asarray(obs, dtype=np.float32), actions], axis=1)

    def inputs(self, obs: np.ndarray, actions: np.ndarray) -> torch.Tensor:
        return torch.as_tensor((self.features(obs, actions) - self.feature_mean) / self.feature_std)

    def outputs(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """(networks, rows, outputs): every network's normalized state change and reward."""
        inputs = self.inputs(obs, actions)
        with torch.no_grad():
            return np.stack([network(inputs).numpy() for network in self.networks])

    def targets(self, arrays: dict) -> np.ndarray:
        """The logged transitions' state changes and rewards, normalized as the networks predict them (those of steps
        that go on)."""
        return (_targets(arrays) - self.target_mean) / self.target_std

    def next_obs_inputs(self, next_obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor((np.asarray(next_obs, dtype=np.float32) - self.next_obs_mean) / self.next_obs_std)

    def ending(self, obs: np.ndarray, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the chance that the step ends the episode, told from the state and the action, and the reward it
        earns if it does."""
        if self.ending_chance is None:
            return np.zeros(len(obs)), np.zeros(len(obs))
        inputs = self.inputs(obs, actions)
        with torch.no_grad():
            chance = torch.sigmoid(self.ending_chance(inputs)[:, 0]).numpy()
            rewards = self.ending_reward(inputs)[:, 0].numpy() * self.ending_reward_std + self.ending_reward_mean
        return chance, np.clip(rewards, self.reward_low, self.reward_high)

    def step(self, out: np.ndarray, obs: np.ndarray,
             ending: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(next states, rewards, probabilities that the step ends the episode, whether the next state left the
        range where a rollout halts) from one network's `outputs` and the states' `ending`, held within the logged
        states and rewards. The ending's chance is the larger of the `ending` and the termination network's on the
        next state as predicted, before it is held: a pole past its angle lies beyond every logged state."""
        predicted = out * self.target_std + self.target_mean
        next_obs = obs + predicted[:, :-1]
        chance, ending_rewards = ending
        rewards = (1 - chance) * np.clip(predicted[:, -1], self.reward_low, self.reward_high) + chance * ending_rewards
        ends = np.maximum(chance, self.ends(next_obs))
        left = ((next_obs < self.halt_low) | (next_obs > self.halt_high)).any(axis=1)
        return np.clip(next_obs, self.obs_low, self.obs_high), rewards, ends, left

    def ends(self, next_obs: np.ndarray) -> np.ndarray:
        """Per row: the termination network's probability that the state ends the episode."""
        with torch.no_grad():
            return torch.sigmoid(self.termination(self.next_obs_inputs(next_obs))[:, 0]).numpy()

    @staticmethod
    def disagreement(outputs: np.ndarray) -> np.ndarray:
        """Per row: the largest distance of a network's normalized state change and reward from the networks'
        mean."""
        return np.linalg.norm(outputs - outputs.mean(axis=0), axis=2).max(axis=0)

    def return_range(self, horizon: int) -> tuple[float, float]:
        """The returns a rollout can reach: the horizon's steps at the lowest or highest logged reward."""
        return horizon * min(self.reward_low, 0.0), horizon * max(self.reward_high, 0.0)


def has_dynamics(episodes: Episodes) -> bool:
    """Whether some logged step goes on: of one-step episodes (a contextual bandit's) there are no dynamics to fit."""
    return not episodes.arrays[Col.TERMINATEDS].all()


def fit_dynamics(episodes: Episodes, num_actions: int | None, config: OPEConfig,
                 progress: Callable[[int, int, float], None]) -> DynamicsEnsemble:
    """`config.model_ensemble` networks, each fitted for `dynamics_updates` steps on its own resample (with
    replacement) of the transitions that do not end an episode, by squared error on the normalized state change and
    reward, and where `config.model_unroll_steps` > 1, then on that many steps unrolled (`_unrolled_fit`) from the
    rows of its resample that start such a stretch; then the termination network, by cross-entropy on every logged
    next state; and where logged steps end episodes, the ending's chance by cross-entropy on every step, and its
    reward by squared error on those steps. `num_actions` is the size of a Discrete action space (None for Box)."""
    a = episodes.arrays
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    resamples = np.random.default_rng(config.seed)
    model = DynamicsEnsemble(episodes, num_actions, config.gamma)
    every_input = model.inputs(a[Col.OBS], a[Col.ACTIONS])
    inputs = every_input[torch.as_tensor(model.goes_on)]
    targets = torch.as_tensor(model.targets(a)[model.goes_on])
    rows = len(targets)
    goes_on_rows = np.flatnonzero(model.goes_on)
    if config.model_unroll_steps > 1:
        stretches = _stretch_starts(episodes, model.goes_on, config.model_unroll_steps)
        if not stretches.any():
            raise UserError(f"ope.model_unroll_steps {config.model_unroll_steps}: no logged episode goes on for that "
                            f"many steps (the longest lasts {episodes.lengths.max()}); lower it, or set 1 to fit one "
                            "step at a time alone")
        fit_unrolled = _unrolled_fit(model, episodes, every_input, config, generator)
    updates = dynamics_updates(len(every_input), config)
    networks = config.model_ensemble + 1  # and the termination network
    for member in range(1, networks):
        network = mlp(inputs.shape[1], config.model_hidden_layers, targets.shape[1])
        resample = torch.as_tensor(resamples.integers(rows, size=rows))
        loss = _fit(network, inputs, targets, torch.nn.functional.mse_loss,
                    lambda r=resample, draw=_draws(rows, config, generator): r[draw()], updates, config.lr)
        if config.model_unroll_steps > 1:
            resampled = goes_on_rows[resample.numpy()]
            loss = fit_unrolled(network, resampled[stretches[resampled]])
        model.networks.append(network.eval())
        progress(member, networks, loss)
    terminated = torch.as_tensor(~model.goes_on, dtype=torch.float32)[:, None]
    every_row = _draws(len(terminated), config, generator)
    termination = mlp(len(model.next_obs_mean), config.model_hidden_layers, 1)
    loss = _fit(termination, model.next_obs_inputs(a[Col.NEW_OBS]), terminated,
                torch.nn.functional.binary_cross_entropy_with_logits, every_row, updates, config.lr)
    model.termination = termination.eval()
    if not model.goes_on.all():
        model.ending_chance = mlp(every_input.shape[1], config.model_hidden_layers, 1)
        _fit(model.ending_chance, every_input, terminated, torch.nn.functional.binary_cross_entropy_with_logits,
             every_row, updates, config.lr)
        rewards = np.asarray(a[Col.REWARDS], dtype=np.float32)[~model.goes_on, None]
        model.ending_reward_mean, model.ending_reward_std = rewards.mean(axis=0), _std(rewards)
        model.ending_reward = mlp(every_input.shape[1], config.model_hidden_layers, 1)
        _fit(model.ending_reward, every_input[torch.as_tensor(~model.goes_on)],
             torch.as_tensor((rewards - model.ending_reward_mean) / model.ending_reward_std),
             torch.nn.functional.mse_loss,
             _draws(len(rewards), config, generator), updates, config.lr)
        model.ending_chance.eval()
        model.ending_reward.eval()
    progress(networks, networks, loss)
    logged = goes_on_rows[resamples.choice(rows, size=min(rows, CALIBRATION_ROWS), replace=False)]
    disagreement = model.disagreement(model.outputs(a[Col.OBS][logged], a[Col.ACTIONS][logged]))
    model.disagreement_limit = float(np.quantile(disagreement, config.model_halt_quantile))
    model.halt_outside(config.model_halt_margin)
    return model


def rollout_returns(model: DynamicsEnsemble, act: Callable[[np.ndarray], np.ndarray], starts: np.ndarray,
                    horizon: int, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """(starts, networks) discounted returns of the policy `act` (states -> actions) rolled out in each network
    from each start, each reward weighted by the chance the rollout has not ended, for `horizon` steps or until that
    chance is negligible, or a halt where the networks disagree (the step's chance of ending then counts its ending
    reward, and the lowest return-to-go logged at that step counts for the share that would go on) or where the state
    reached leaves the range `fit_dynamics` set from `model_halt_margin` (the lowest return-to-go logged at the next
    step counts for the share that goes on); and (starts, networks) the chance that each halted."""
    returns = np.zeros((len(starts), len(model)))
    halted = np.zeros((len(starts), len(model)))

    def halt(stopped: np.ndarray, share: np.ndarray, step: int) -> None:
        """The rollouts `stopped` halt at `step`: the lowest return-to-go logged there counts for their `share`."""
        halted[stopped, network] = share
        returns[stopped, network] += gamma**step * share * model.halt_value(step)
        going_on[stopped] = 0

    for network in range(len(model)):
        obs = np.array(starts, dtype=np.float32)
        going_on = np.ones(len(starts))  # the chance that the rollout has not ended (0 once it halted)
        for step in range(horizon):
            rows = np.flatnonzero(going_on >= NEGLIGIBLE_CHANCE)
            if not len(rows):
                break
            actions = act(obs[rows])
            chance, ending_rewards = model.ending(obs[rows], actions)
            outputs = model.outputs(obs[rows], actions)
            # Where the networks part, the step's share that ends does; the share that would go on halts
            unknown = model.disagreement(outputs) > model.disagreement_limit
            stopped = rows[unknown]
            returns[stopped, network] += gamma**step * going_on[stopped] * chance[unknown] * ending_rewards[unknown]
            halt(stopped, going_on[stopped] * (1 - chance[unknown]), step)
            rows, known = rows[~unknown], ~unknown
            next_obs, rewards, ends, left = model.step(outputs[network][known], obs[rows],
                                                       (chance[known], ending_rewards[known]))
            returns[rows, network] += gamma**step * going_on[rows] * rewards
            obs[rows] = next_obs
            going_on[rows] *= 1 - ends
            # Where the state reached left the logged range, the share that goes on halts there
            stopped = rows[left & (step + 1 < horizon)]
            halt(stopped, going_on[stopped], step + 1)
    return returns, halted


def dynamics_updates(rows: int, config: OPEConfig) -> int:
    """Gradient steps of each network fitted on `rows` logged transitions: `model_updates`, or `model_epochs` passes
    over them if that is more."""
    return max(config.model_updates, math.ceil(config.model_epochs * rows / config.batch_size))


def _fit(network: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
         loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], draw_batch: Callable[[], torch.Tensor],
         updates: int, lr: float) -> float:
    """`updates` Adam steps at `lr` on the loss of the network's outputs against the targets, on batches of rows
    drawn by `draw_batch`; the last batch's loss."""
    optimizer = torch.optim.Adam(network.parameters(), lr=lr)
    for _ in range(updates):
        batch = draw_batch()
        loss = loss_of(network(inputs[batch]), targets[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def _unrolled_fit(model: DynamicsEnsemble, episodes: Episodes, every_input: torch.Tensor, config: OPEConfig,
                  generator: torch.Generator) -> Callable[[torch.nn.Module, np.ndarray], float]:
    """A fit of a network by `config.model_unroll_updates` Adam steps on stretches of `config.model_unroll_steps`
    logged steps that go on, from given rows: each step from the state it predicted the step before, with the logged
    action, and the loss the squared error of every step's state and reward against the logged ones, normalized as
    the one-step fit's (which it equals at one step); it gives the last batch's loss. The logged columns it unrolls
    over are read once, for every network."""
    a, steps = episodes.arrays, config.model_unroll_steps
    dims = len(model.next_obs_mean)
    obs, next_obs = (torch.as_tensor(np.array(a[column], dtype=np.float32)) for column in (Col.OBS, Col.NEW_OBS))
    normalized_rewards = torch.as_tensor(model.targets(a)[:, -1])
    obs_mean, obs_std = torch.as_tensor(model.feature_mean[:dims]), torch.as_tensor(model.feature_std[:dims])
    change_mean, change_std = torch.as_tensor(model.target_mean[:-1]), torch.as_tensor(model.target_std[:-1])

    def fit(network: torch.nn.Module, starts: np.ndarray) -> float:
        draw = _draws(len(starts), config, generator)
        optimizer = torch.optim.Adam(network.parameters(), lr=config.lr * UNROLL_LR_SHARE)
        for _ in range(config.model_unroll_updates):
            rows = torch.as_tensor(starts)[draw()]
            state, loss = obs[rows], 0.0
            for step in range(steps):
                out = network(torch.cat([(state - obs_mean) / obs_std, every_input[rows + step, dims:]], dim=1))
                state = state + out[:, :-1] * change_std + change_mean
                errors = torch.cat([(state - next_obs[rows + step]) / change_std,
                                    (out[:, -1] - normalized_rewards[rows + step])[:, None]], dim=1)
                loss = loss + (errors**2).mean() / steps
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return loss.item()
    return fit


def _stretch_starts(episodes: Episodes, goes_on: np.ndarray, steps: int) -> np.ndarray:
    """Per logged row, whether `steps` steps from it lie in its episode and go on (an ending is an episode's last
    step, so the last of them going on says all do)."""
    last = np.minimum(np.arange(len(goes_on)) + steps - 1, len(goes_on) - 1)
    return (episodes.step_of_rows + steps <= episodes.lengths[episodes.episode_of_rows]) & goes_on[last]


def _draws(rows: int, config: OPEConfig, generator: torch.Generator) -> Callable[[], torch.Tensor]:
    """Minibatches of `config.batch_size` row numbers below `rows`, drawn uniformly."""
    return lambda: torch.randint(rows, (config.batch_size,), generator=generator)


def _targets(arrays: dict) -> np.ndarray:
    """The state's change and the reward, as the networks predict them (before normalization)."""
    obs = np.asarray(arrays[Col.OBS], dtype=np.float32)
    change = np.asarray(arrays[Col.NEW_OBS], dtype=np.float32) - obs
    return np.concatenate([change, np.asarray(arrays[Col.REWARDS], dtype=np.float32)[:, None]], axis=1)


def _std(values: np.ndarray) -> np.ndarray:
    """Per column; 1 where a column is constant (a one-hot action never taken, a reward always the same)."""
    std = values.std(axis=0)
    return np.where(std > 1e-6, std, 1.0).astype(np.float32)
