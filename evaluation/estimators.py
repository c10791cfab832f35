"""Off-policy estimators of a policy's expected return from logged episodes alone.

- Fitted Q evaluation (FQE; Le et al. 2019): a Q-network fitted to r + gamma * V(s') under the evaluated policy
  over the logged transitions, read at each episode's first state.
- Weighted per-decision importance sampling (WPDIS; Precup et al. 2000): each step's reward weighed by the
  product of pi(a|s) / mu(a|s) up to that step, the weights normalized across episodes step by step.
- Weighted doubly robust (WDR; Thomas & Brunskill 2016): FQE's values as the baseline, those weights correcting it.

The model-based estimator, with dynamics of its own, is in evaluation/model_based.py.

The return is the one `orl evaluate` measures: undiscounted (gamma 1 by default) over an episode of the env's time
limit. A state's value then depends on the time left, so FQE's network takes t / horizon as an input, and nothing
follows a step at the horizon.

The evaluated policy enters as `pi`, one row per state: its action probabilities over a Discrete space, or the
action it takes in a Box space (where it has no density, so only FQE applies).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from common.errors import UserError
from common.observations import ModelInput
from dataset_format import Col, StackedObservations, episode_bounds
from evaluation.config import OPEConfig


# Rows whose values are read at once after the fit: bounds the memory of images as float32.
CHUNK = 4096


@dataclass(frozen=True)
class Episodes:
    """Logged transitions as dataset columns (`dataset_format.load_arrays`, or for images `load_frame_arrays`, whose
    observations are rebuilt from their frames as rows are read), episode after episode, each from t 0."""

    arrays: dict[str, np.ndarray]
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray]) -> Episodes:
        return cls(arrays, *episode_bounds(arrays[Col.EPS_ID]))

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def lengths(self) -> np.ndarray:
        return self.ends - self.starts

    def select(self, episodes: np.ndarray) -> Episodes:
        """The given episodes (indices into this set), in that order."""
        rows = np.concatenate([np.arange(self.starts[i], self.ends[i]) for i in episodes])
        return Episodes.of({name: values.take(rows) if isinstance(values, StackedObservations) else values[rows]
                            for name, values in self.arrays.items()})

    def padded(self, values: np.ndarray) -> np.ndarray:
        """Per-transition values as an (episodes, longest episode) matrix, 0 after each episode's end."""
        matrix = np.zeros((len(self), self.lengths.max()), dtype=np.float64)
        matrix[self._cells()] = values
        return matrix

    def returns_to_go(self, gamma: float) -> np.ndarray:
        """Each transition's logged return from its step to its episode's end, discounted by gamma."""
        rewards = self.padded(self.arrays[Col.REWARDS])
        to_go = np.zeros_like(rewards)
        following = np.zeros(len(self))
        for step in reversed(range(rewards.shape[1])):
            following = to_go[:, step] = rewards[:, step] + gamma * following
        return to_go[self._cells()]

    @property
    def episode_of_rows(self) -> np.ndarray:
        """The index of each transition's episode."""
        return np.repeat(np.arange(len(self)), self.lengths)

    @property
    def step_of_rows(self) -> np.ndarray:
        """Each transition's step in its episode, from 0."""
        return np.arange(self.lengths.sum()) - np.repeat(self.starts, self.lengths)

    def _cells(self) -> tuple[np.ndarray, np.ndarray]:
        """(episode, step) of each transition in `padded`'s matrix."""
        return self.episode_of_rows, self.step_of_rows


@dataclass(frozen=True)
class FitReport:
    """How FQE's fit went, in squared units of the rewards. A fit whose final TD loss is above the variance of the
    logged returns-to-go predicts one step worse than a constant would predict the return: it did not converge, and
    its values are no estimate. Where every logged return-to-go is the same (no reward at all), the value bounds hold
    every Q-value at it: the fit is exact whatever its loss."""

    td_loss_start: float
    """Mean TD loss over the first tenth of the iterations."""
    td_loss: float
    """Mean TD loss over the last tenth of the iterations."""
    td_loss_limit: float
    """The variance of the logged returns-to-go."""

    @property
    def converged(self) -> bool:
        return bool(np.isfinite(self.td_loss) and (self.td_loss <= self.td_loss_limit or self.td_loss_limit == 0))


class QFunction:
    """A fitted Q-network, in the units of the rewards, held within the returns the data allows."""

    def __init__(self, net: torch.nn.Module, scale: float, bounds: ValueBounds, discrete: bool,
                 observations: ModelInput, fit: FitReport):
        self.net, self.scale, self.bounds, self.discrete = net, scale, bounds, discrete
        self.observations, self.fit = observations, fit

    def return_range(self) -> tuple[float, float]:
        """The lowest and highest return from an episode's first step that the data allows."""
        ends = torch.tensor([-np.inf, np.inf], dtype=torch.float64)
        low, high = self.bounds.clamp(ends, np.zeros(2, dtype=np.int64)).tolist()
        return self.scale * low, self.scale * high

    def values(self, obs: np.ndarray, t: np.ndarray, pi: np.ndarray) -> np.ndarray:
        """V(s_t) = E_{a ~ pi} Q(s_t, a) by each head: (rows, heads)."""
        return self._by_chunks(obs, t, pi, _value)

    def q(self, obs: np.ndarray, t: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """Q(s_t, a_t) of the given actions by each head: (rows, heads)."""
        return self._by_chunks(obs, t, actions, _q_taken)

    def _by_chunks(self, obs: np.ndarray, t: np.ndarray, actions: np.ndarray, read) -> np.ndarray:
        """`read` over rows a chunk at a time (images become float32 only a chunk at a time), clamped and scaled."""
        values = []
        with torch.no_grad():
            for start in range(0, len(t), CHUNK):
                rows = slice(start, start + CHUNK)
                value = read(self.net, _inputs(self.observations, obs[rows]), _time(t[rows], self.bounds.horizon),
                             _writable_tensor(actions[rows]), self.discrete)
                values.append(self.bounds.clamp(value, t[rows]).numpy())
        return self.scale * np.concatenate(values)


@dataclass(frozen=True)
class ValueBounds:
    """The values a state at step t can have as far as the data shows: within the smallest and largest logged
    return-to-go, and within the smallest and largest logged reward summed (discounted) over the steps left before
    the horizon. Bootstrapped targets are held within them, so that the values of actions the data never shows at
    a state cannot run away: a greedy policy's FQE fit diverged otherwise (docs/ope.md, "Values the data allows")."""

    horizon: int
    gamma: float
    reward_min: float
    reward_max: float
    return_min: float
    return_max: float

    def clamp(self, values: torch.Tensor, t: np.ndarray) -> torch.Tensor:
        steps_left = np.maximum(self.horizon - t, 1)
        most = steps_left if self.gamma == 1 else (1 - self.gamma**steps_left) / (1 - self.gamma)
        low = np.maximum(np.minimum(self.reward_min, self.reward_min * most), self.return_min)
        high = np.minimum(np.maximum(self.reward_max, self.reward_max * most), self.return_max)
        per_row = (-1,) + (1,) * (values.dim() - 1)  # a row's bounds hold for each of its heads
        return torch.clamp(values, torch.as_tensor(low, dtype=values.dtype).reshape(per_row),
                           torch.as_tensor(high, dtype=values.dtype).reshape(per_row))


def fit_fqe(episodes: Episodes, pi_next: np.ndarray, num_actions: int | None, horizon: int, config: OPEConfig,
            progress: Callable[[int, int, float], None], observations: ModelInput) -> QFunction:
    """Fits Q to r + gamma * V(s') on the episodes' transitions; `pi_next` is the policy at each `new_obs`, and
    `num_actions` the size of a Discrete action space (None for Box). `observations` maps the stored observations
    to the network's input (a Discrete one one-hot). Each of `config.fqe_heads` heads weighs each episode's
    transitions by its own Poisson(1) draw: a bootstrap resample of the episodes (one head: every weight 1)."""
    a = episodes.arrays
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    heads = config.fqe_heads
    draws = np.random.default_rng(config.seed).poisson(1.0, (len(episodes), heads)) if heads > 1 else \
        np.ones((len(episodes), 1))
    weights = torch.as_tensor(draws[episodes.episode_of_rows], dtype=torch.float32)  # (transitions, heads)
    discrete = num_actions is not None
    t = a[Col.T].astype(np.int64)
    now, then = _time(t, horizon), _time(t + 1, horizon)
    actions, pi_next = torch.tensor(a[Col.ACTIONS]), _tensor(pi_next)  # copies: dataset arrays are read-only
    # Nothing follows a terminal state, nor the last step of an episode the time limit cut.
    done = a[Col.TERMINATEDS] | (a[Col.TRUNCATEDS] & (t + 1 >= horizon))
    # Fitted in units of (horizon x mean |reward|), so that Q-values are of order 1 whatever the rewards' size.
    scale = float(max(horizon * np.abs(a[Col.REWARDS]).mean(), 1e-6))
    rewards = torch.as_tensor(a[Col.REWARDS] / scale, dtype=torch.float32)
    returns_to_go = episodes.returns_to_go(config.gamma) / scale
    bounds = ValueBounds(horizon, config.gamma, float(rewards.min()), float(rewards.max()),
                         float(returns_to_go.min()), float(returns_to_go.max()))
    discount = torch.as_tensor(config.gamma * ~done, dtype=torch.float32)

    net = QNetwork(observations, config, 1 + (0 if discrete else actions.shape[1]), num_actions or 1, heads)
    target = copy.deepcopy(net)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr)
    iterations = config.iterations or horizon
    losses = np.zeros(iterations)  # each iteration's mean TD loss, in squared units of the rewards
    for iteration in range(1, iterations + 1):
        target.load_state_dict(net.state_dict())
        for _ in range(config.updates_per_iteration):
            rows = torch.randint(len(t), (config.batch_size,), generator=generator)
            picked = rows.numpy()
            with torch.no_grad():
                next_value = _value(target, _inputs(observations, a[Col.NEW_OBS][picked]), then[rows], pi_next[rows],
                                    discrete)
                y = rewards[rows, None] + discount[rows, None] * bounds.clamp(next_value, t[picked] + 1)
            q_taken = _q_taken(net, _inputs(observations, a[Col.OBS][picked]), now[rows], actions[rows], discrete)
            w = weights[rows]  # each head's weighted mean: a plain mean would scale each step by its draws' sum
            loss = ((w * (q_taken - y) ** 2).sum(dim=0) / w.sum(dim=0).clamp(min=1)).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses[iteration - 1] += loss.item() * scale**2 / config.updates_per_iteration
        progress(iteration, iterations, losses[iteration - 1])
    tenth = max(1, iterations // 10)
    fit = FitReport(float(losses[:tenth].mean()), float(losses[-tenth:].mean()),
                    float(np.var(returns_to_go * scale)))
    return QFunction(net.eval(), scale, bounds, discrete, observations, fit)


def log_ratios(episodes: Episodes, pi: np.ndarray) -> np.ndarray:
    """log pi(a|s) - log mu(a|s) of each logged action (Discrete actions; -inf where pi never takes it)."""
    a = episodes.arrays
    with np.errstate(divide="ignore"):
        log_pi = np.log(pi[np.arange(len(pi)), a[Col.ACTIONS]])
    return log_pi - a[Col.ACTION_LOGP].astype(np.float64)


@dataclass(frozen=True)
class Weighted:
    """What the weighted estimators read, as (episodes, steps) matrices: cumulative log importance weights
    (carried past each episode's end), rewards, and FQE's Q(s_t, a_t) and V(s_t) (0 past the end)."""

    log_weights: np.ndarray
    rewards: np.ndarray
    q: np.ndarray
    v: np.ndarray
    discounts: np.ndarray

    @classmethod
    def of(cls, episodes: Episodes, log_ratios: np.ndarray, q: np.ndarray, v: np.ndarray, gamma: float) -> Weighted:
        log_weights = np.cumsum(episodes.padded(log_ratios), axis=1)
        return cls(log_weights, episodes.padded(episodes.arrays[Col.REWARDS]), episodes.padded(q),
                   episodes.padded(v), gamma ** np.arange(log_weights.shape[1]))

    def resampled(self, episodes: np.ndarray) -> Weighted:
        return Weighted(self.log_weights[episodes], self.rewards[episodes], self.q[episodes], self.v[episodes],
                        self.discounts)

    def normalized_weights(self) -> np.ndarray:
        """Each step's weights over episodes, summing to 1 (all 0 at a step no episode's actions reach)."""
        top = self.log_weights.max(axis=0, keepdims=True)
        with np.errstate(invalid="ignore"):
            weights = np.where(np.isfinite(top), np.exp(self.log_weights - top), 0.0)
        totals = weights.sum(axis=0, keepdims=True)
        return np.divide(weights, totals, out=np.zeros_like(weights), where=totals > 0)

    def wpdis(self) -> float:
        return float(self.discounts @ (self.normalized_weights() * self.rewards).sum(axis=0))

    def wdr(self) -> float:
        weights = self.normalized_weights()
        before = np.hstack([np.full((len(weights), 1), 1.0 / len(weights)), weights[:, :-1]])
        per_step = (weights * (self.rewards - self.q) + before * self.v).sum(axis=0)
        return float(self.discounts @ per_step)

    def effective_episodes(self) -> float:
        """Kish's effective sample size of the final weights: how many episodes the estimate rests on."""
        final = self.normalized_weights()[:, -1]
        return float(1.0 / np.square(final).sum()) if final.any() else 0.0


def bootstrap(statistic: Callable[[np.ndarray], float], episodes: int, config: OPEConfig) -> tuple[float, float]:
    """Percentile interval of `statistic(episode indices)` over resamples of the episodes with replacement."""
    rng = np.random.default_rng(config.seed)
    values = [statistic(rng.integers(episodes, size=episodes)) for _ in range(config.bootstrap_samples)]
    tail = 100 * (1 - config.confidence) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def resampling_members(values: np.ndarray, seed: int) -> Callable[[np.ndarray], float]:
    """`bootstrap`'s statistic for an ensemble's (episodes, members) values: the mean over the resampled episodes and
    a resample of the members, so that the interval includes the members' spread, the fit's own variance."""
    members = np.random.default_rng(seed)

    def statistic(sample: np.ndarray) -> float:
        return float(values[sample][:, members.integers(values.shape[1], size=values.shape[1])].mean())
    return statistic


def _inputs(observations: ModelInput, obs: np.ndarray) -> torch.Tensor:
    """Stored observations as the network's input (channels-last images, in [0, 1] for pixels)."""
    return _writable_tensor(observations(obs))


def _writable_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor of `array`, copied only where it is read-only (a slice of the dataset's arrays), which torch warns
    about."""
    return torch.as_tensor(np.require(array, requirements="W"))


def _time(t: np.ndarray, horizon: int) -> torch.Tensor:
    """The share of the horizon already spent, a column."""
    return torch.as_tensor((t / horizon)[:, None], dtype=torch.float32)


def _tensor(pi: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(pi, dtype=torch.float32)


def _value(net: QNetwork, obs: torch.Tensor, time: torch.Tensor, pi: torch.Tensor, discrete: bool) -> torch.Tensor:
    """(rows, heads)."""
    if discrete:
        return (net(obs, time) * pi[:, None, :]).sum(dim=2)
    return net(obs, torch.cat([time, pi.float()], dim=1)).squeeze(2)


def _q_taken(net: QNetwork, obs: torch.Tensor, time: torch.Tensor, actions: torch.Tensor,
             discrete: bool) -> torch.Tensor:
    """(rows, heads)."""
    if discrete:
        q = net(obs, time)
        return q.gather(2, actions.long()[:, None, None].expand(-1, q.shape[1], 1)).squeeze(2)
    return net(obs, torch.cat([time, actions.float()], dim=1)).squeeze(2)


class QNetwork(torch.nn.Module):
    """Q over an observation and extra inputs (the time feature, and the action for Box actions), by each of `heads`
    output layers over shared hidden layers: (rows, heads, outputs). An image goes through a CNN first
    (`conv_filters`, as the learners' encoders), a vector straight to the hidden layers."""

    def __init__(self, observations: ModelInput, config: OPEConfig, extra_inputs: int, outputs: int, heads: int):
        super().__init__()
        shape = observations.input_shape
        if len(shape) == 3:
            height, width, channels = shape
            layers = []
            for out_channels, kernel, stride in config.conv_filters:
                height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
                if min(height, width) < 1:
                    raise UserError(f"ope.conv_filters {config.conv_filters} leave no pixels of a {shape[0]}x{shape[1]} "
                                    "image; give smaller kernels or strides in params.yaml")
                layers += [torch.nn.Conv2d(channels, out_channels, kernel, stride), torch.nn.ReLU()]
                channels = out_channels
            self.encoder = torch.nn.Sequential(*layers, torch.nn.Flatten())
            features = channels * height * width
        else:
            self.encoder = torch.nn.Flatten()
            features = int(np.prod(shape))
        self.head = mlp(features + extra_inputs, config.hidden_layers, heads * outputs)
        self.image = len(shape) == 3
        self.heads = heads

    def forward(self, obs: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        if self.image:
            obs = obs.permute(0, 3, 1, 2)  # channels-last frames, as torch's convolutions take them: channels first
        return self.head(torch.cat([self.encoder(obs), extra], dim=1)).unflatten(1, (self.heads, -1))


def mlp(inputs: int, hidden_layers: list[int], outputs: int) -> torch.nn.Sequential:
    layers, width = [], inputs
    for size in hidden_layers:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, outputs))
