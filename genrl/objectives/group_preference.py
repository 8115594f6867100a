"""DGPO: Direct Group Preference Optimization (Luo, Hu, Tang, arXiv 2510.08425, ICLR 2026) on
noised endpoints: the group-level DPO loss (``GroupPreferenceLoss``) and its objective
(``DGPOObjective``). The algorithm (``genrl/algorithms/dgpo.py``) pairs it with the endpoint
rollout; ``docs/algorithms/dgpo.md`` cites the released code line by line.

A group of ``k`` samples of one prompt is split by advantage into a positive set (``A_i > 0``)
and a negative one (``A_i < 0``), each member weighted by ``|A_i|``. With the Diffusion-DPO
implicit reward of a member at a noising shared by the group,
``R_i = -beta * (e_i - e_ref,i)``, ``e = mean_dims (u - v)^2``, the group objective is
``log sigmoid(R(G+) - R(G-))`` with ``R(G+) - R(G-) = (1 / k) sum_i A_i R_i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from genrl.data.batches import NoisedEndpoints
from genrl.objectives.advantages import PerPromptStatTracker, clip_advantages
from genrl.objectives.base import StepContext
from genrl.objectives.losses import Metrics
from genrl.objectives.regression import (
    EndpointRegression,
    unit_velocity,
)
from genrl.objectives.regression_configs import DGPOObjectiveConfig
from genrl.objectives.regression_losses import per_sample_mean
from genrl.policies.protocols import FlowPolicy


@dataclass
class GroupPreferenceLoss:
    """DGPO's group-level DPO loss, in the released code's gradient-equivalent form.

    Per member, the flow-matching errors of the current and the reference velocity:
    ``e_i = mean_dims (u_i - v_i)^2`` and ``e_ref,i`` (no gradient). Per group, the negated
    preference margin ``s = beta / k * sum_i A_i (e_i - e_ref,i)``, i.e.
    ``-(R(G+) - R(G-))``; the DPO loss of the group is ``-log sigmoid(-s) = softplus(s)``.
    Its gradient is ``sigmoid(s) * beta / k * sum_i A_i grad e_i``, so the code trains the
    surrogate

    ``L = mean_{units, members} stopgrad(sigmoid(s)) * A_i * e_i  +  kl_beta * mean (v - v_kl)^2``

    whose gradient is the DPO gradient averaged over groups, divided by ``beta`` (the surrogate,
    not ``softplus(s)``, is what the reference back-propagates; ``softplus(s)`` is logged as
    ``group_dpo_loss``). A member whose advantage is 0 (every member of a group with equal
    rewards) adds nothing to the first term but still counts in its mean.

    PPO-style clipping (``clip_range``, with ``old_velocity``): with ``ratio = exp(e_old - e)``,
    a member's ``e_i`` is detached where ``A_i > 0`` and ``ratio > 1 + c`` or ``A_i <= 0`` and
    ``ratio < 1 - c``; ``clip_kl`` detaches its KL term there too.

    Args:
        beta: the DPO scale ``beta_dpo`` (released configs: 100; 10 PickScore).
        kl_beta: weight of the velocity KL to ``kl_velocity`` (released: 0.02 GenEval/OCR,
            0.001 PickScore; 0 drops it).
        clip_range: ``c`` above (released: 0.01 GenEval/OCR); None disables clipping.
        clip_kl: also stop the KL's gradient on clipped members (released: False).

    Shapes: velocities and ``target_velocity`` ``[U, k, *event]``; ``advantages`` ``[U, k]``.
    """

    beta: float
    kl_beta: float = 0.0
    clip_range: float | None = None
    clip_kl: bool = False

    def __call__(
        self,
        velocity: torch.Tensor,
        reference_velocity: torch.Tensor,
        target_velocity: torch.Tensor,
        advantages: torch.Tensor,
        old_velocity: torch.Tensor | None = None,
        kl_velocity: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Metrics]:
        group_size = velocity.shape[1]
        advantages = advantages.float()
        error = per_sample_mean((target_velocity - velocity) ** 2, 2)  # [U, k]
        with torch.no_grad():
            reference_error = per_sample_mean((target_velocity - reference_velocity) ** 2, 2)
            margin = self.beta * (advantages * (error - reference_error)).sum(1) / group_size
            group_weights = torch.sigmoid(margin)  # [U]
        should_clip = torch.zeros_like(error, dtype=torch.bool)
        if self.clip_range is not None and old_velocity is not None:
            with torch.no_grad():
                old_error = per_sample_mean((target_velocity - old_velocity) ** 2, 2)
                ratio = torch.exp(old_error - error)
                should_clip = torch.where(
                    advantages > 0, ratio > 1 + self.clip_range, ratio < 1 - self.clip_range
                )
        trained_error = torch.where(should_clip, error.detach(), error)
        policy_loss = (group_weights[:, None] * advantages * trained_error).mean()
        loss = policy_loss
        metrics: Metrics = {
            "policy_loss": policy_loss.detach(),
            "group_dpo_loss": F.softplus(margin).mean(),
            "group_weight_mean": group_weights.mean(),
            "flow_matching_error": error.detach().mean(),
            "reference_error": reference_error.mean(),
            "clip_fraction": should_clip.float().mean(),
        }
        if kl_velocity is not None and self.kl_beta > 0:
            kl = per_sample_mean((velocity - kl_velocity.detach()) ** 2, 2)  # [U, k]
            metrics["kl"] = kl.detach().mean()
            if self.clip_kl:
                kl = torch.where(should_clip, kl.detach(), kl)
            loss = loss + self.kl_beta * kl.mean()
        return loss, metrics


class DGPOObjective(EndpointRegression):
    """DGPO's group preference loss (``GroupPreferenceLoss``) on whole groups."""

    def __init__(self, config: DGPOObjectiveConfig, rollout: Any, group_size: int) -> None:
        super().__init__(
            config, rollout, group_size, group_units=True, member_noise=not config.share_noise
        )
        self.config = config
        self.tracker = PerPromptStatTracker(config.std_mode, 1)
        self.loss_fn = GroupPreferenceLoss(
            config.beta, config.kl_beta, config.clip_range, config.clip_kl
        )

    @property
    def uses_reference(self) -> bool:
        return self.config.reference == "frozen" or self.config.kl_beta > 0

    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        """Per-prompt ``(r - mean) / (std + 1e-4)``, clipped (the released code clips at the
        loss; clipping here is the same, the advantages are used nowhere else)."""
        del group_ids, inputs
        return clip_advantages(self.tracker.update(prompts, rewards), self.config.advantage_clip)

    def sampler_levels(self) -> torch.Tensor:
        levels = super().sampler_levels()
        if self.config.sampler_levels is None:
            return levels
        return levels[: self.config.sampler_levels]

    def loss(
        self, policy: FlowPolicy, minibatch: NoisedEndpoints, step: StepContext | None = None
    ) -> tuple[torch.Tensor, Metrics]:
        del step
        c, mb = self.config, minibatch
        target = mb.noise - mb.clean
        frozen = old = None
        with torch.no_grad():
            if self.uses_reference:
                with policy.reference():
                    frozen = unit_velocity(policy, mb, c.reference_guidance_scale)
            if c.needs_lagged_copy:
                with self.rollout.lagged_weights():
                    old = unit_velocity(policy, mb)
        velocity = unit_velocity(policy, mb)
        reference = frozen if c.reference == "frozen" else old
        assert reference is not None
        return self.loss_fn(velocity, reference, target, mb.advantages, old, frozen)


__all__ = ["DGPOObjective", "DGPOObjectiveConfig", "GroupPreferenceLoss"]
