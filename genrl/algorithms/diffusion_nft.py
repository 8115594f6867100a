"""DiffusionNFT: online diffusion reinforcement on the forward process (Zheng et al. 2025,
arXiv 2509.16117; used by MARBLE).

Clean samples come from the "old" policy, a lagged copy of the current one, with a deterministic
sampler and no CFG. Each sample's advantage becomes an optimality probability
``r = clamp(A / (2 A_max) + 1/2, 0, 1)``; training noises the samples as in pretraining and fits
two implicit policies built from the current and old velocities, a positive one towards the
sample with weight ``r`` and a negative one with weight ``1 - r`` (eq. 8), each loss normalised by
its own detached ``x_0`` error (the released code's adaptive weighting), plus a small velocity
KL to the reference. See ``genrl.regression_losses.NFTLoss``.

Differences from the released code, on purpose: endpoints come from our Euler ODE (the code
uses a second-order DPM solver; nothing about the sampler enters the loss), and ``t`` is drawn
``noisings_per_sample`` times per sample from the sampler's noise levels rather than as a
permutation of them (``time_sampling=uniform`` is the paper's Algorithm 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from genrl.advantages import PerPromptStatTracker, clip_advantages
from genrl.algorithms.base import StepContext, register_algorithm
from genrl.algorithms.flow_endpoints import EndpointAlgorithm, EndpointConfig, unit_velocity
from genrl.overrides import ConfigError
from genrl.regression_losses import NFTLoss
from genrl.rollout import NoisedEndpoints


@dataclass
class DiffusionNFTConfig(EndpointConfig):
    name: str = "diffusion_nft"
    """Registry name."""
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
    noisings_per_sample: int = 9
    """Noise levels trained per sample (released code: 9 of its 10 sampler steps)."""
    time_sampling: Literal["uniform", "linear", "logit_normal", "sampler_steps"] = "sampler_steps"
    """Uniform over the sampler's noise levels, like the released code."""
    sampling_ema_decay: float = 0.5
    """Largest decay of the old policy (released code: ``min(0.001 * step, 0.5)``)."""
    sampling_ema_ramp: float = 0.001
    """Per-iteration growth of the old policy's decay (0.0075 with a 75-iteration delay and a
    0.999 cap for OCR)."""

    def validate(self, train_config: Any = None) -> None:
        super().validate(train_config)
        if self.beta <= 0:
            raise ConfigError(f"algorithm.beta must be positive, got {self.beta}")
        if self.advantage_clip <= 0:
            raise ConfigError(
                f"algorithm.advantage_clip must be positive, got {self.advantage_clip}"
            )
        if self.kl_beta < 0:
            raise ConfigError(f"algorithm.kl_beta must be >= 0, got {self.kl_beta}")
        if train_config is not None and train_config.sampler.guidance_scale != 1:
            raise ConfigError(
                "diffusion_nft samples without CFG (the guidance is learned into the weights): "
                f"set sampler.guidance_scale=1 (got {train_config.sampler.guidance_scale})"
            )


@register_algorithm("diffusion_nft")
class DiffusionNFT(EndpointAlgorithm):
    Config = DiffusionNFTConfig
    config: DiffusionNFTConfig
    uses_lagged_copy = True

    def __init__(self, config: DiffusionNFTConfig, train_config: Any) -> None:
        super().__init__(config, train_config)
        self.tracker = PerPromptStatTracker(config.std_mode, 1)
        self.objective = NFTLoss(config.beta, config.advantage_clip, config.kl_beta)

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
        self, policy: Any, minibatch: NoisedEndpoints, step: StepContext | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mb = minibatch
        reference = None
        with torch.no_grad():
            with self.lagged_weights():
                old = unit_velocity(policy, mb).flatten(0, 1)
            if self.config.kl_beta > 0:
                with policy.reference():
                    reference = unit_velocity(policy, mb).flatten(0, 1)
        velocity = unit_velocity(policy, mb).flatten(0, 1)
        return self.objective(
            velocity,
            old,
            reference,
            mb.noised.flatten(0, 1),
            mb.clean.flatten(0, 1),
            mb.sigma.repeat_interleave(mb.clean.shape[1]),
            self.optimality(mb.advantages.reshape(-1)),
        )


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
