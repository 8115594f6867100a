"""RAM: Reinforce Adjoint Matching (Bergmeister et al. 2026, arXiv 2605.10759).

No SDE rollout, no reward gradient, no adjoint sweep: draw clean endpoints from the model with
the deterministic ODE, score them, noise them as in pretraining at ``noisings_per_sample``
draws of ``t`` (density proportional to ``t`` by default), and regress the velocity onto the
reward-corrected pretraining target (eq. 17):

    L = || v_theta(x_t) - stopgrad( v_ref(x_t) + m A(x_0) ((eps - x_0) - v_corr(x_t)) ) ||^2

``A`` is the per-prompt advantage (global std), ``m`` the ``reward_multiplier``. ``v_corr`` is the
lagged copy of the policy that also draws the endpoints (the released code, default) or the
current velocity detached (eq. 17 as written). Loss velocities are conditional (no CFG) even
when sampling uses CFG, as in the released code. Section 5's path-cost correction is not
implemented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from genrl.advantages import PerPromptStatTracker
from genrl.algorithms.base import StepContext, register_algorithm
from genrl.algorithms.flow_endpoints import EndpointAlgorithm, EndpointConfig, unit_velocity
from genrl.overrides import ConfigError
from genrl.regression_losses import RAMLoss
from genrl.rollout import NoisedEndpoints


@dataclass
class RAMConfig(EndpointConfig):
    name: str = "ram"
    """Registry name."""
    reward_multiplier: float = 100.0
    """``m``: scales the advantages in the target (released configs: 100 GenEval/OCR, 1000
    PickScore, whose differences are small); ``1 / m`` acts as the KL weight."""
    correction: Literal["lagged", "current"] = "lagged"
    """Velocity in the correction term: ``lagged`` (the endpoint-sampling copy, the released
    code; one more forward per unit) or ``current`` (eq. 17: the current velocity, detached)."""
    time_weighting: Literal["none", "control"] = "none"
    """Weight of each unit's squared error: ``none`` (released code) or ``control``,
    ``2 (1 - t) / t`` (``t >= 1e-3``), the factor that turns a velocity error into the control
    error of the memoryless SDE (``sigma_t^2 = 2t / (1 - t)``, ``sigma_t u = 2 (v - v_ref)``), as
    in adjoint matching; not used by the released code."""
    min_weight: float | None = None
    """Floor of the per-sample weight ``w = m A`` (> -1, e.g. -0.9). A sample's own fixed point
    of the semi-gradient, ``v = (v_ref + w u) / (1 + w)``, flips sign for ``w < -1``; the
    released code does not clamp (None), because per-prompt advantages average to zero, so the
    mean weight at a point stays near 0. The share of units with ``w < -1`` is logged."""
    std_mode: Literal["group", "global", "none"] = "global"
    """Advantage normaliser: per-prompt mean, std of the whole iteration's rewards (released
    code) or per prompt, or none."""
    noisings_per_sample: int = 8
    """``K`` draws of ``(t, eps)`` per endpoint (released code: 8)."""
    time_sampling: Literal["uniform", "linear", "logit_normal", "sampler_steps"] = "linear"
    """``p(t) = 2t`` (released code)."""
    time_min: float = 0.0
    """``t`` ranges over (0, 1]."""
    time_max: float = 1.0
    """Largest ``t``."""
    sampling_ema_decay: float = 0.9
    """Decay of the lagged copy: ``min(ramp * iteration, this)`` (released code: 0.9 with ramp
    0.01, so the copy starts equal to the policy)."""
    sampling_ema_ramp: float = 0.01
    """Per-iteration growth of the lagged copy's decay."""

    def validate(self, train_config: Any = None) -> None:
        super().validate(train_config)
        if self.reward_multiplier <= 0:
            raise ConfigError(
                f"algorithm.reward_multiplier must be positive, got {self.reward_multiplier}"
            )
        if self.min_weight is not None and not self.min_weight > -1:
            raise ConfigError(
                f"algorithm.min_weight must be > -1 (where the fixed point flips sign), got "
                f"{self.min_weight}"
            )


@register_algorithm("ram")
class RAM(EndpointAlgorithm):
    Config = RAMConfig
    config: RAMConfig
    uses_lagged_copy = True

    def __init__(self, config: RAMConfig, train_config: Any) -> None:
        super().__init__(config, train_config)
        self.tracker = PerPromptStatTracker(config.std_mode, 1)
        self.objective = RAMLoss()

    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        del group_ids, inputs
        return self.tracker.update(prompts, rewards)

    def loss(
        self, policy: Any, minibatch: NoisedEndpoints, step: StepContext | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mb = minibatch
        target = (mb.noise - mb.clean).flatten(0, 1)
        with torch.no_grad():
            with policy.reference():
                reference = unit_velocity(policy, mb).flatten(0, 1)
            if self.config.correction == "lagged":
                with self.lagged_weights():
                    correction = unit_velocity(policy, mb).flatten(0, 1)
        velocity = unit_velocity(policy, mb).flatten(0, 1)
        if self.config.correction == "current":
            correction = velocity.detach()
        weights = self.config.reward_multiplier * mb.advantages.reshape(-1)
        below = float((weights < -1).float().mean())
        if self.config.min_weight is not None:
            weights = weights.clamp(min=self.config.min_weight)
        time_weights = None
        if self.config.time_weighting == "control":
            t = mb.sigma.repeat_interleave(mb.clean.shape[1]).clamp_min(1e-3)
            time_weights = 2 * (1 - t) / t
        loss, metrics = self.objective(
            velocity, reference, correction, target, weights, time_weights
        )
        metrics["weight_below_minus_one"] = below
        return loss, metrics
