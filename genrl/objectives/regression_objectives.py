"""The three regression objectives on noised endpoints (``genrl/objectives/regression.py``):
RAM, GDRO and DiffusionNFT, each its advantages, its fields and its loss
(``genrl/objectives/regression_losses.py``). Their algorithms pair them with the endpoint
rollout (``genrl/algorithms/ram.py``, ``gdro.py``, ``diffusion_nft.py`` document the choices).
"""

from __future__ import annotations

from typing import Any

import torch

from genrl.data.batches import NoisedEndpoints
from genrl.objectives.advantages import PerPromptStatTracker, clip_advantages, group_moments
from genrl.objectives.base import StepContext
from genrl.objectives.losses import Metrics
from genrl.objectives.regression import (
    EndpointRegression,
    unit_velocity,
)
from genrl.objectives.regression_configs import (
    GDROObjectiveConfig,
    NFTObjectiveConfig,
    RAMObjectiveConfig,
)
from genrl.objectives.regression_losses import GroupRankingLoss, NFTLoss, RAMLoss
from genrl.policies.protocols import FlowPolicy


# -- RAM -------------------------------------------------------------------------------------------
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
class GDROObjective(EndpointRegression):
    """GDRO's group ranking loss (``GroupRankingLoss``, eq. 5, 7-9) on whole groups."""

    def __init__(self, config: GDROObjectiveConfig, rollout: Any, group_size: int) -> None:
        super().__init__(
            config, rollout, group_size, group_units=True, member_noise=not config.share_noise
        )
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
