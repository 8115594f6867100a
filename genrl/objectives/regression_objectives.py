"""The three regression objectives on noised endpoints (``genrl/objectives/regression.py``):
RAM, GDRO and DiffusionNFT, each its advantages, its fields and its loss
(``genrl/objectives/regression_losses.py``). Their algorithms pair them with the endpoint
rollout (``genrl/algorithms/ram.py``, ``gdro.py``, ``diffusion_nft.py`` document the choices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from genrl.config.errors import ConfigError
from genrl.data.batches import FlowEndpoints, NoisedEndpoints
from genrl.data.rng import RolloutNoise
from genrl.objectives.advantages import PerPromptStatTracker, clip_advantages, group_moments
from genrl.objectives.base import StepContext
from genrl.objectives.losses import Metrics
from genrl.objectives.regression import (
    EndpointRegression,
    NoisingConfig,
    per_member_noise,
    unit_velocity,
)
from genrl.objectives.regression_losses import GroupRankingLoss, NFTLoss, RAMLoss
from genrl.policies.protocols import FlowPolicy


# -- RAM -------------------------------------------------------------------------------------------
@dataclass
class RAMObjectiveConfig(NoisingConfig):
    """RAM's fields (besides the noisings')."""

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

    def validate_objective(self) -> None:
        self.validate_noising()
        if self.reward_multiplier <= 0:
            raise ConfigError(
                f"algorithm.reward_multiplier must be positive, got {self.reward_multiplier}"
            )
        if self.min_weight is not None and not self.min_weight > -1:
            raise ConfigError(
                f"algorithm.min_weight must be > -1 (where the fixed point flips sign), got "
                f"{self.min_weight}"
            )


class RAMObjective(EndpointRegression):
    """Reinforce Adjoint Matching's regression (``RAMLoss``, eq. 17) on noised endpoints."""

    def __init__(self, config: RAMObjectiveConfig, rollout: Any, group_size: int) -> None:
        super().__init__(config, rollout, group_size)
        self.config = config
        self.tracker = PerPromptStatTracker(config.std_mode, 1)
        self.loss_fn = RAMLoss()

    @property
    def uses_reference(self) -> bool:
        return True  # the regression target is built on the reference velocity

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
        self, policy: FlowPolicy, minibatch: NoisedEndpoints, step: StepContext | None = None
    ) -> tuple[torch.Tensor, Metrics]:
        del step
        mb = minibatch
        target = (mb.noise - mb.clean).flatten(0, 1)
        with torch.no_grad():
            with policy.reference():
                reference = unit_velocity(policy, mb).flatten(0, 1)
            if self.config.correction == "lagged":
                with self.rollout.lagged_weights():
                    correction = unit_velocity(policy, mb).flatten(0, 1)
        velocity = unit_velocity(policy, mb).flatten(0, 1)
        if self.config.correction == "current":
            correction = velocity.detach()
        weights = self.config.reward_multiplier * mb.advantages.reshape(-1)
        below = (weights < -1).float().mean().detach()
        if self.config.min_weight is not None:
            weights = weights.clamp(min=self.config.min_weight)
        time_weights = None
        if self.config.time_weighting == "control":
            t = mb.sigma.repeat_interleave(mb.clean.shape[1]).clamp_min(1e-3)
            time_weights = 2 * (1 - t) / t
        loss, metrics = self.loss_fn(velocity, reference, correction, target, weights, time_weights)
        metrics["weight_below_minus_one"] = below
        return loss, metrics


# -- GDRO ------------------------------------------------------------------------------------------
@dataclass
class GDROObjectiveConfig(NoisingConfig):
    """GDRO's fields (besides the noisings')."""

    beta: float = 6.0
    """Implicit-reward scale ``T * beta_KL`` (paper: 6 GenEval, 12 OCR; with ``reduction=mean``
    the values are not comparable to the paper's if it sums over dims)."""
    tau: float = 0.05
    """Temperature of the soft ranking targets ``softmax(r / tau)`` on raw rewards (paper: 0.05;
    0 = hard Plackett-Luce)."""
    gamma: float = 1.0
    """Weight of the best sample's flow-matching loss (paper: 1.0 GenEval, 0.5 OCR)."""
    reduction: Literal["mean", "sum"] = "mean"
    """Reduction over dims inside the squared norms of the implicit reward."""
    share_noise: bool = True
    """One ``eps`` for the whole group (as Diffusion-DPO's pairs); False draws one per member
    (``t`` is always shared)."""

    def validate_objective(self) -> None:
        self.validate_noising()
        if self.beta <= 0:
            raise ConfigError(f"algorithm.beta must be positive, got {self.beta}")
        if self.tau < 0 or self.gamma < 0:
            raise ConfigError(f"algorithm.tau and gamma must be >= 0, got {self.tau}, {self.gamma}")


class GDROObjective(EndpointRegression):
    """GDRO's group ranking loss (``GroupRankingLoss``, eq. 5, 7-9) on whole groups."""

    def __init__(self, config: GDROObjectiveConfig, rollout: Any, group_size: int) -> None:
        super().__init__(config, rollout, group_size, group_units=True)
        self.config = config
        self.loss_fn = GroupRankingLoss(config.beta, config.tau, config.gamma, config.reduction)

    @property
    def uses_reference(self) -> bool:
        return True  # the implicit reward compares with the reference's error

    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        """Rewards minus their group mean: the soft targets ``softmax(r / tau)`` and the ranking
        do not change under a shift, and this keeps the reward scale ``tau`` refers to."""
        del prompts, inputs
        means, _, inverse = group_moments(rewards, group_ids)
        return rewards - means[inverse]

    def units(
        self, policy: FlowPolicy, batch: FlowEndpoints, noise: RolloutNoise
    ) -> NoisedEndpoints:
        units = super().units(policy, batch, noise)
        if not self.config.share_noise:  # one eps per member: its own stream
            size = units.clean.shape[1]
            units.noise = per_member_noise(noise, batch, size, self.config.noisings_per_sample)
        return units

    def loss(
        self, policy: FlowPolicy, minibatch: NoisedEndpoints, step: StepContext | None = None
    ) -> tuple[torch.Tensor, Metrics]:
        del step
        mb = minibatch
        target = mb.noise - mb.clean
        with torch.no_grad(), policy.reference():
            reference = unit_velocity(policy, mb)
        velocity = unit_velocity(policy, mb)
        return self.loss_fn(velocity, reference, target, mb.advantages)


# -- DiffusionNFT ------------------------------------------------------------------------------------
@dataclass
class NFTObjectiveConfig(NoisingConfig):
    """DiffusionNFT's fields (besides the noisings')."""

    beta: float = 1.0
    """Strength of the implicit guidance: ``v+ = beta v + (1 - beta) v_old`` (released configs:
    1.0 GenEval/PickScore/HPS, 0.1 OCR and multi-reward)."""
    advantage_clip: float = 5.0
    """``A_max``: advantages are clipped to +-this and mapped to ``r = A / (2 A_max) + 1/2``; the
    policy loss is also scaled by it (released code: 5)."""
    adv_mode: Literal["all", "positive_only", "negative_only", "one_only", "binary"] = "all"
    """How clipped advantages enter ``r`` (the released ``train_nft_sd3.py``'s
    ``config.train.adv_mode``): ``all`` as they are; ``positive_only`` / ``negative_only`` keep
    one sign (the other becomes 0, i.e. ``r = 1/2``); ``one_only``: 1 for positive, else 0;
    ``binary``: their sign (-1, 0, +1)."""
    kl_beta: float = 1e-4
    """Weight of ``mean (v - v_ref)^2`` (released code: 1e-4; 0 skips the reference forward)."""
    std_mode: Literal["group", "global", "none"] = "global"
    """Advantage normaliser (released code: per-prompt mean, global std)."""

    def validate_objective(self) -> None:
        self.validate_noising()
        if self.beta <= 0:
            raise ConfigError(f"algorithm.beta must be positive, got {self.beta}")
        if self.advantage_clip <= 0:
            raise ConfigError(
                f"algorithm.advantage_clip must be positive, got {self.advantage_clip}"
            )
        if self.kl_beta < 0:
            raise ConfigError(f"algorithm.kl_beta must be >= 0, got {self.kl_beta}")


def apply_adv_mode(advantages: torch.Tensor, mode: str) -> torch.Tensor:
    """DiffusionNFT's ``adv_mode`` on clipped advantages (``scripts/train_nft_sd3.py`` of
    NVlabs/DiffusionNFT, applied after the clip to +-``adv_clip_max``)."""
    if mode == "all":
        return advantages
    if mode == "positive_only":
        return advantages.clamp(min=0)
    if mode == "negative_only":
        return advantages.clamp(max=0)
    if mode == "one_only":
        return (advantages > 0).to(advantages.dtype)
    if mode == "binary":
        return torch.sign(advantages)
    raise ValueError(
        f"adv_mode must be all, positive_only, negative_only, one_only or binary, got {mode!r}"
    )


class NFTObjective(EndpointRegression):
    """DiffusionNFT's negative-aware loss (``NFTLoss``) against the rollout's lagged copy."""

    def __init__(self, config: NFTObjectiveConfig, rollout: Any, group_size: int) -> None:
        super().__init__(config, rollout, group_size)
        self.config = config
        self.tracker = PerPromptStatTracker(config.std_mode, 1)
        self.loss_fn = NFTLoss(config.beta, config.advantage_clip, config.kl_beta)

    @property
    def uses_reference(self) -> bool:
        return self.config.kl_beta > 0

    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        del group_ids, inputs
        clipped = clip_advantages(self.tracker.update(prompts, rewards), self.config.advantage_clip)
        return apply_adv_mode(clipped, self.config.adv_mode)

    def optimality(self, advantages: torch.Tensor) -> torch.Tensor:
        """``r = clamp(A / (2 A_max) + 1/2, 0, 1)``: the probability that a sample is "positive"."""
        return (advantages / (2 * self.config.advantage_clip) + 0.5).clamp(0, 1)

    def loss(
        self, policy: FlowPolicy, minibatch: NoisedEndpoints, step: StepContext | None = None
    ) -> tuple[torch.Tensor, Metrics]:
        del step
        mb = minibatch
        reference = None
        with torch.no_grad():
            with self.rollout.lagged_weights():
                old = unit_velocity(policy, mb).flatten(0, 1)
            if self.config.kl_beta > 0:
                with policy.reference():
                    reference = unit_velocity(policy, mb).flatten(0, 1)
        velocity = unit_velocity(policy, mb).flatten(0, 1)
        return self.loss_fn(
            velocity,
            old,
            reference,
            mb.noised.flatten(0, 1),
            mb.clean.flatten(0, 1),
            mb.sigma.repeat_interleave(mb.clean.shape[1]),
            self.optimality(mb.advantages.reshape(-1)),
        )


__all__ = [
    "GDROObjective",
    "GDROObjectiveConfig",
    "NFTObjective",
    "NFTObjectiveConfig",
    "RAMObjective",
    "RAMObjectiveConfig",
    "apply_adv_mode",
]
