"""GDRO: Group-level Direct Reward Optimization (Wang et al. 2026, arXiv 2601.02036).

A DPO-style implicit reward is available at any noise level: for a group of ``k`` samples of one
prompt, noised with one shared ``(t, eps)``, ``s_i = -beta (||u_i - v_theta||^2 - ||u_i - v_ref||^2)``
(eq. 5). The group is ranked by its explicit rewards and trained with a Plackett-Luce loss whose
targets are ``softmax(r / tau)`` over the members not yet placed (eq. 7), plus ``gamma`` times the
flow-matching loss of the best sample, which keeps its likelihood from falling (eq. 8-9).
Nothing depends on how the samples were drawn, so GDRO trains fully offline
(``train.offline_store``: the reference model samples once, training runs many epochs over the
store) or online on the current model's ODE samples. See ``GroupRankingLoss``.

Choices the paper leaves open (documented fields): the squared norms are means over dims
(``reduction``), ``t`` and ``eps`` are shared by the group (``share_noise``), ``t`` is uniform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from genrl.advantages import group_moments
from genrl.algorithms.base import RolloutNoise, StepContext, register_algorithm
from genrl.algorithms.flow_endpoints import EndpointAlgorithm, EndpointConfig, unit_velocity
from genrl.overrides import ConfigError
from genrl.regression_losses import GroupRankingLoss
from genrl.rollout import FlowEndpoints, NoisedEndpoints


@dataclass
class GDROConfig(EndpointConfig):
    name: str = "gdro"
    """Registry name."""
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
    noisings_per_sample: int = 1
    """Noisings per group and iteration (each one unit of ``k`` members)."""

    def validate(self, train_config: Any = None) -> None:
        super().validate(train_config)
        if self.beta <= 0:
            raise ConfigError(f"algorithm.beta must be positive, got {self.beta}")
        if self.tau < 0 or self.gamma < 0:
            raise ConfigError(f"algorithm.tau and gamma must be >= 0, got {self.tau}, {self.gamma}")
        if self.sampling_ema_decay or self.sampling_ema_ramp or self.sampling_ema_delay:
            raise ConfigError(
                "gdro keeps no lagged copy of the policy: its samples come from the current "
                "model (online) or the reference (offline store); drop algorithm.sampling_ema_*"
            )
        if train_config is not None and train_config.train.group_size < 2:
            raise ConfigError("gdro ranks a group: train.group_size must be >= 2")


@register_algorithm("gdro")
class GDRO(EndpointAlgorithm):
    Config = GDROConfig
    config: GDROConfig
    group_units = True
    supports_offline = True

    def __init__(self, config: GDROConfig, train_config: Any) -> None:
        super().__init__(config, train_config)
        self.objective = GroupRankingLoss(config.beta, config.tau, config.gamma, config.reduction)

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

    def training_units(self, rollout: FlowEndpoints, noise: RolloutNoise) -> NoisedEndpoints:
        units = super().training_units(rollout, noise)
        if not self.config.share_noise:  # one eps per member: its own stream of the same tag
            size = units.clean.shape[1]
            eps = noise.randn_by_sample(
                32_000,
                (self.config.noisings_per_sample, *rollout.samples.shape[1:]),
                rollout.samples.device,
            )
            k = self.config.noisings_per_sample
            groups = len(rollout) // size
            # eps[n, k] -> units [g * k, size]
            per_member = eps.view(groups, size, k, *eps.shape[2:]).transpose(1, 2)
            units.noise = per_member.reshape(groups * k, size, *eps.shape[2:]).contiguous()
        return units

    def loss(
        self, policy: Any, minibatch: NoisedEndpoints, step: StepContext | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mb = minibatch
        target = mb.noise - mb.clean
        with torch.no_grad(), policy.reference():
            reference = unit_velocity(policy, mb)
        velocity = unit_velocity(policy, mb)
        return self.objective(velocity, reference, target, mb.advantages)
