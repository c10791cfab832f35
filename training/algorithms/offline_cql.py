"""RLlib's CQL (SAC-based, continuous actions), made to train from `offline_data` alone.

RLlib 2.60's CQLConfig still counts as online, so CQL builds env runners (and fails without an env), and
its setup asks them whether the module is stateful. `OfflineCQL` builds none, like BC and MARWIL.

Its tanh-squashed policy acts in [-1, 1]. Online, RLlib's env runners rescale those actions to the env's
bounds; its offline pipeline does not, so its batch function (`with_unit_actions`) rescales the dataset's
actions (kept in the env's bounds, where users expect them) to [-1, 1]. `common.trained_policy.ModulePolicy` maps back.

Its Q-network is the CQL paper's, one MLP of `hidden_layers` over the observation and action concatenated
(`ConcatQCatalog`, shared.py).

RLlib 2.60's `lagrangian` flag is read by no learner of the new API stack; `OfflineCQLTorchLearner` learns the
conservative weight itself where `CQLParams.lagrangian_threshold` is set.

RLlib 2.60's SAC learner leaves its learned entropy temperature out of its state, so a resumed run started it again
at `initial_alpha`; `OfflineCQLTorchLearner` checkpoints it with the conservative weight.

RLlib 2.60's penalty values the actions its policy samples at the next states at those next states;
`OfflineCQLTorchRLModule` values them at the current states by default, as the CQL paper's code, CORL and d3rlpy do
(`CQLParams.next_actions_penalized_at`). With `CQLParams.target_action` `mean` it evaluates the target critics at the
policy's mean next action, as d3rlpy does.
"""

from __future__ import annotations

import math

import torch
from ray.rllib.algorithms.cql import CQL, CQLConfig
from ray.rllib.algorithms.cql.torch.cql_torch_learner import CQLTorchLearner
from ray.rllib.algorithms.sac.sac_learner import ACTION_DIST_INPUTS_NEXT, QF_PREDS, QF_TWIN_PREDS
from ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module import DefaultSACTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.core.models.base import ENCODER_OUT
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from training.algorithms.lean_learner import LeanTorchLearner
from training.algorithms.rllib_internals import mark_offline, q_network_outputs, temp_losses
from training.algorithms.shared import CRITIC_LAYER_NORM, ConcatQCatalog, TargetsPerUpdate, WithoutEnvRunners
from training.config import CURRENT, MEAN, NEXT, SAMPLED

# The keys of `learner_config_dict` that turn the learned conservative weight on (registry.py sets them).
LAGRANGIAN_THRESHOLD = "lagrangian_threshold"
LAGRANGIAN_LR = "lagrangian_lr"
# The optimizer of the multiplier's log, its key in the learner's state, and the metrics it logs.
CONSERVATIVE_WEIGHT = "conservative_weight"
LOG_CONSERVATIVE_WEIGHTS = "log_conservative_weights"
CONSERVATIVE_GAP = "conservative_gap"
# The key in the learner's state of SAC's learned entropy temperature (its log, `curr_log_alpha`), by module.
LOG_ENTROPY_TEMPERATURES = "log_entropy_temperatures"
# The module's `model_config` keys of `CQLParams.target_action` and `CQLParams.next_actions_penalized_at`.
TARGET_ACTION = "target_action"
PENALTY_STATES = "next_actions_penalized_at"


class OfflineCQLTorchLearner(TargetsPerUpdate, LeanTorchLearner, CQLTorchLearner):
    """Target critics follow by Polyak averaging at every gradient update (shared.py).

    With a Lagrangian threshold, the conservative penalty `min_q_weight * gap` is scaled by a multiplier learned
    by dual gradient descent, as d3rlpy's CQL does by default (the CQL paper's Lagrangian form): `gap` is the
    logsumexp of Q over the sampled actions less Q on the data's actions, and the multiplier's log moves to
    raise the penalty while the gap is above the threshold and lower it while below.
    """

    def build(self) -> None:
        self.log_conservative_weights: dict[str, torch.Tensor] = {}  # filled as the optimizers are configured
        super().build()

    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        super().configure_optimizers_for_module(module_id, config)
        settings = config.learner_config_dict
        if settings.get(LAGRANGIAN_THRESHOLD) is None:
            return
        log_weight = torch.zeros((), device=self.device, requires_grad=True)  # the multiplier starts at 1
        self.register_optimizer(module_id=module_id, optimizer_name=CONSERVATIVE_WEIGHT,
                                optimizer=torch.optim.Adam([log_weight]), params=[log_weight],
                                lr_or_lr_schedule=settings[LAGRANGIAN_LR])
        self.log_conservative_weights[module_id] = log_weight

    def get_state(self, *args, **kwargs):
        return {**super().get_state(*args, **kwargs),
                LOG_CONSERVATIVE_WEIGHTS: {key: weight.item() for key, weight in self.log_conservative_weights.items()},
                LOG_ENTROPY_TEMPERATURES: {key: alpha.item() for key, alpha in self.curr_log_alpha.items()}}

    def set_state(self, state) -> None:
        super().set_state(state)
        with torch.no_grad():  # a resumed run goes on from the multiplier and the temperature it had reached
            for module_id, value in state.get(LOG_CONSERVATIVE_WEIGHTS, {}).items():
                self.log_conservative_weights[module_id].fill_(value)
            for module_id, value in state.get(LOG_ENTROPY_TEMPERATURES, {}).items():
                self.curr_log_alpha[module_id].fill_(value)

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        log_weight = self.log_conservative_weights.get(module_id)
        if log_weight is None:
            return super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        multiplier = log_weight.exp().clamp(max=1e6)  # d3rlpy's clip, for stability
        scaled = ScaledPenalty(config, config.min_q_weight * multiplier.detach())
        loss = super().compute_loss_for_module(module_id=module_id, config=scaled, batch=batch, fwd_out=fwd_out)
        gap = conservative_gap(config, fwd_out)
        threshold = config.learner_config_dict[LAGRANGIAN_THRESHOLD]
        temp_losses(self)[(module_id, CONSERVATIVE_WEIGHT + "_loss")] = (
            -multiplier * config.min_q_weight * (gap - threshold))
        self.metrics.log_dict({CONSERVATIVE_WEIGHT: multiplier.detach(), CONSERVATIVE_GAP: gap}, key=module_id,
                              window=1)
        return loss


class ScaledPenalty:
    """The algorithm config, with `min_q_weight` a tensor: the multiplier scales RLlib's whole penalty term."""

    def __init__(self, config, min_q_weight: torch.Tensor):
        self._config, self.min_q_weight = config, min_q_weight

    def __getattr__(self, name):
        return getattr(self._config, name)


@torch.no_grad()
def conservative_gap(config, fwd_out: dict) -> torch.Tensor:
    """The penalty's unweighted gap as RLlib 2.60's CQL learner builds it from its module's training outputs:
    temperature * logsumexp(Q / temperature) over uniform, current-policy and next-policy actions, each less its
    log-density, less the mean Q on the data's actions (averaged over the twin critics)."""
    action_dim = fwd_out["actions_curr_repeat"].shape[-1]
    uniform_log_density = action_dim * math.log(0.5)  # actions in [-1, 1]
    gaps = []
    for prefix, data_q in (("q", QF_PREDS), ("q_twin", QF_TWIN_PREDS)):
        if f"{prefix}_rand_repeat" not in fwd_out:
            continue
        sampled = torch.cat([fwd_out[f"{prefix}_rand_repeat"] - uniform_log_density,
                             fwd_out[f"{prefix}_next_repeat"] - fwd_out["logps_next_repeat"],
                             fwd_out[f"{prefix}_curr_repeat"] - fwd_out["logps_curr_repeat"]], dim=1)
        logsumexp = config.temperature * torch.logsumexp(sampled / config.temperature, dim=1).mean()
        gaps.append(logsumexp - fwd_out[data_q].mean())
    return torch.stack(gaps).mean()


class OfflineCQLTorchRLModule(DefaultSACTorchRLModule):
    """SAC's module, plus the Q-values that CQL's penalty pushes down, under the keys RLlib 2.60's CQL learner reads:
    at each state s, of `num_actions` actions sampled uniformly in [-1, 1], from the policy at s and from the policy at
    the next state s'. RLlib's own CQL module values the last at s' (Q(s', a')), which penalizes the bootstrap targets
    instead of the current state's out-of-data actions; the CQL paper's code, CORL and d3rlpy value them at s, as this
    module does unless `next_actions_penalized_at` is `next`.

    SAC's outputs evaluate the target critics at an action sampled at s'; with `target_action` `mean`, at the
    policy's mean action there, tanh of the Gaussian's mean, as d3rlpy's CQL does."""

    def _forward_train(self, batch: dict) -> dict:
        fwd_out = super()._forward_train(batch)
        obs, repeats = batch[Columns.OBS], self.model_config["num_actions"]
        # Uniform over [-1, 1], where the critics see the data's actions and whose log-density the learner subtracts.
        # RLlib 2.60's CQL module samples within the env's bounds instead: half outside [-1, 1] for Pendulum's 2.
        uniform = 2 * torch.rand((obs.shape[0] * repeats, self.action_space.shape[0]), device=obs.device) - 1
        sampled = {"rand": (uniform, None), "curr": self._sample_repeated(obs, repeats),
                   "next": self._sample_repeated(batch[Columns.NEXT_OBS], repeats)}
        at_states = dict.fromkeys(sampled, torch.repeat_interleave(obs, repeats, dim=0))
        if self.model_config.get(PENALTY_STATES) == NEXT:  # absent from checkpoints made before it was a choice
            at_states["next"] = torch.repeat_interleave(batch[Columns.NEXT_OBS], repeats, dim=0)
        critics = [("q", self.qf_encoder, self.qf)]
        if self.twin_q:
            critics.append(("q_twin", self.qf_twin_encoder, self.qf_twin))
        for name, (actions, logps) in sampled.items():
            fwd_out[f"actions_{name}_repeat"] = actions
            if logps is not None:
                fwd_out[f"logps_{name}_repeat"] = logps.view(-1, repeats, 1)
            for prefix, encoder, head in critics:
                values = q_network_outputs(self, {Columns.OBS: at_states[name], Columns.ACTIONS: actions}, encoder,
                                           head)
                fwd_out[f"{prefix}_{name}_repeat"] = values.view(-1, repeats, 1)
        if self.model_config[TARGET_ACTION] == MEAN:
            with torch.no_grad():
                mean_actions = torch.tanh(fwd_out[ACTION_DIST_INPUTS_NEXT].chunk(2, dim=-1)[0])
                fwd_out["q_target_next"] = self.forward_target({Columns.OBS: batch[Columns.NEXT_OBS],
                                                                Columns.ACTIONS: mean_actions})
        return fwd_out

    @torch.no_grad()  # the penalty trains the critics, not the policy
    def _sample_repeated(self, obs: torch.Tensor, repeats: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`repeats` actions sampled from the policy at each state, and their log-densities, state by state."""
        logits = self.pi(self.pi_encoder({Columns.OBS: torch.repeat_interleave(obs, repeats, dim=0)})[ENCODER_OUT])
        return self.get_train_action_dist_cls().from_logits(logits).rsample_and_logp()


class OfflineCQLConfig(CQLConfig):
    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or OfflineCQL)
        mark_offline(self)
        self.target_action = SAMPLED
        self.next_actions_penalized_at = CURRENT
        self.critic_layer_norm = False

    def training(self, *, target_action: str | None = None, next_actions_penalized_at: str | None = None,
                 critic_layer_norm: bool | None = None, **kwargs) -> OfflineCQLConfig:
        super().training(**kwargs)
        if target_action is not None:
            self.target_action = target_action
        if next_actions_penalized_at is not None:
            self.next_actions_penalized_at = next_actions_penalized_at
        if critic_layer_norm is not None:
            self.critic_layer_norm = critic_layer_norm
        return self

    @property
    def _model_config_auto_includes(self):
        return super()._model_config_auto_includes | {TARGET_ACTION: self.target_action,
                                                      PENALTY_STATES: self.next_actions_penalized_at,
                                                      CRITIC_LAYER_NORM: self.critic_layer_norm}

    def get_default_learner_class(self):
        return OfflineCQLTorchLearner

    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=OfflineCQLTorchRLModule, catalog_class=ConcatQCatalog)


class OfflineCQL(WithoutEnvRunners, CQL):
    @classmethod
    def get_default_config(cls) -> OfflineCQLConfig:
        return OfflineCQLConfig()
