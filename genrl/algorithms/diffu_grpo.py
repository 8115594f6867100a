"""diffu-GRPO (d1): GRPO for masked-diffusion LMs with the one-step likelihood estimator.

Zhao et al., "d1: Scaling Reasoning in Diffusion Large Language Models via Reinforcement
Learning" (2025), diffu-GRPO: every inner iteration scores the sampled completion in ONE forward
with the completion fully masked and each prompt token masked with probability 0.15 (a fresh seed
per iteration, shared by the old, current and reference policies); per-token log-probs are the
mean-field estimate. Advantages are ``r - mean_group`` (no std), mu = 12 iterations, clip 0.5,
beta 0.04. It is ``mask_grpo`` with those settings; this file only fixes the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from genrl.algorithms.base import register_algorithm
from genrl.algorithms.mask_grpo import MaskGRPO, MaskGRPOConfig


@dataclass
class DiffuGRPOConfig(MaskGRPOConfig):
    name: str = "diffu_grpo"
    """Registry name."""
    estimator: Literal["maskgrpo", "d1", "random_ratio", "trace"] = "d1"
    """d1's one-step estimator."""
    num_iterations: int = 12
    """Inner iterations mu (d1: 12), each with its own prompt-mask seed."""
    clip_range: float = 0.5
    """d1's epsilon."""
    std_mode: Literal["group", "global", "none"] = "none"
    """d1's advantage is ``r - mean`` of the group."""
    kl_beta: float = 0.04
    """d1's beta."""


@register_algorithm("diffu_grpo")
class DiffuGRPO(MaskGRPO):
    Config = DiffuGRPOConfig
