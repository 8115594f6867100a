"""The token policy gradient of the GRPO family (GRPO, Dr.GRPO, DAPO's loss, GSPO, RLOO).

Shao et al., "DeepSeekMath" (2024), eq. 3: rewards normalised within each prompt's group become
sequence advantages, and every completion token contributes a PPO-clipped ratio term, optionally
with a KL to the reference policy:

    A_i = (r_i - mean_g r) / (std_g r + eps)
    L = agg_{i,t} max(-A_i rho_{i,t}, -A_i clip(rho_{i,t}, 1 - eps_low, 1 + eps_high))
        + beta * agg_{i,t} KL(pi_theta || pi_ref)_{i,t},      rho = pi_theta / pi_old.

``TokenObjective`` holds what every token objective shares (advantages, the surrogate, the token
count of DAPO's step-wide mean); ``TokenPolicyGradient`` scores a causal LM's completions and
``genrl/objectives/masked_tokens.py`` a masked-diffusion LM's corrupted views.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

from genrl.advantages import median_centered_advantages, sequence_advantages, validate_median_groups
from genrl.losses import AGGREGATIONS, Metrics, TokenClippedSurrogate, token_policy_loss
from genrl.objectives.base import Objective, StepContext, updates_once
from genrl.overrides import ConfigError
from genrl.protocols import CausalTokenPolicy, TokenPolicy
from genrl.rng import RolloutNoise
from genrl.rollout import Batch, TokenRollout

TP = TypeVar("TP", bound=TokenPolicy)
TB = TypeVar("TB", bound=Batch)
TU = TypeVar("TU", bound=Batch)


@dataclass
class TokenPolicyGradientConfig:
    """Fields of the token objectives, with GRPO's defaults (TRL's where the paper is silent)."""

    clip_range: float = 0.2
    """PPO epsilon, low side (and high side unless set); GRPO 0.2, GSPO 3e-4."""
    clip_range_high: float | None = None
    """Upper epsilon (DAPO clip-higher: 0.28; GSPO: 4e-4); None = ``clip_range``."""
    aggregation: Literal["sequence_mean", "token_mean", "bnpo", "sequence_sum", "constant"] = (
        "sequence_mean"
    )
    """Loss reduction over tokens (``genrl.losses.aggregate``): per-sequence mean (GRPO, TRL
    ``grpo``); token mean over the optimizer step's tokens on all processes (DAPO, TRL ``dapo``);
    token mean per minibatch (TRL ``bnpo``); mean of per-sequence token sums (verl
    ``seq-mean-token-sum``); token sum / (B * max_new_tokens) (Dr.GRPO)."""
    advantage: Literal["group", "rloo", "median"] = "group"
    """``group``: z-score within the group (std per ``std_mode``); ``rloo``: leave-one-out;
    ``median``: MC-GRPO (Kim 2026): groups of ``G + 1`` (an odd ``train.group_size``) centred on
    their median and scaled by its absolute deviation, the median sample left out of training
    (``genrl.advantages.median_centered_advantages``)."""
    std_mode: Literal["group", "global", "none"] = "group"
    """Divide by the group's reward std (GRPO), the batch's (``global``) or nothing (Dr.GRPO)."""
    std_estimator: Literal["sample", "population"] = "sample"
    """Std of the normaliser: Bessel's, as TRL and verl (``torch.std``), or the population's."""
    std_eps: float = 1e-4
    """Added to the std (TRL: 1e-4; verl: 1e-6)."""
    kl_beta: float = 0.0
    """Weight of the KL to the reference (DeepSeekMath 0.04; TRL and DAPO 0). 0 skips the
    reference forward entirely."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator (Schulman's k3 is GRPO's); the KL term is reduced with
    ``aggregation``, as in TRL and verl."""
    clip_ratio_c: float | None = None
    """Dual-clip bound (> 1) on the ratio of negative-advantage tokens (verl's ``clip_ratio_c``,
    3 there); None (TRL) disables it."""
    advantage_clip: float | None = None
    """Clamp advantages to +-this; None disables."""
    mad_eps: float = 1e-3
    """``advantage=median``: added to the median absolute deviation (MC-GRPO: 1e-3)."""

    def validate_objective(self, train_config: Any = None) -> None:
        if self.clip_range <= 0 or (self.clip_range_high is not None and self.clip_range_high <= 0):
            raise ConfigError("algorithm.clip_range and clip_range_high must be positive")
        if self.kl_beta < 0:
            raise ConfigError(f"algorithm.kl_beta must be >= 0, got {self.kl_beta}")
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(f"algorithm.aggregation must be one of {AGGREGATIONS}")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ConfigError(f"algorithm.clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.std_eps < 0:
            raise ConfigError(f"algorithm.std_eps must be >= 0, got {self.std_eps}")
        if train_config is not None:
            if train_config.generation.temperature <= 0:
                raise ConfigError(
                    "generation.temperature must be > 0: greedy rollouts give every member of a "
                    "group the same answer, hence zero advantages"
                )
            if train_config.train.group_size < 2:
                raise ConfigError("train.group_size must be >= 2: advantages compare a group")
            validate_median_groups(self.advantage, train_config.train.group_size)


class TokenObjective(Objective[TP, TB, TU]):
    """What the token objectives share: group advantages, the clipped surrogate, and the loss
    token count of a step-wide token mean.

    Args:
        config: the objective's fields.
        train_config: the run's config (``generation.max_new_tokens``, ``train``'s batching).
        ratio_level: ``token`` or ``sequence`` (GSPO).
    """

    def __init__(
        self,
        config: TokenPolicyGradientConfig,
        train_config: Any,
        ratio_level: Literal["token", "sequence"] = "token",
    ) -> None:
        self.config = config
        self.train_config = train_config
        self.surrogate = TokenClippedSurrogate(
            config.clip_range,
            config.clip_range_high,
            level=ratio_level,
            aggregation=config.aggregation,
            max_length=train_config.generation.max_new_tokens,
            clip_ratio_c=config.clip_ratio_c,
        )

    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        """``[N]`` group-relative advantages (``genrl.advantages.sequence_advantages``)."""
        del prompts, inputs
        c = self.config
        return sequence_advantages(
            rewards,
            group_ids,
            c.advantage,
            c.std_mode,
            c.advantage_clip,
            eps=c.mad_eps if c.advantage == "median" else c.std_eps,
            std_estimator=c.std_estimator,
        )

    def excluded_samples(
        self, rewards: torch.Tensor, group_ids: torch.Tensor
    ) -> torch.Tensor | None:
        """MC-GRPO's pivots (``advantage=median``): one median sample per group."""
        if self.config.advantage != "median":
            return None
        return median_centered_advantages(rewards, group_ids, self.config.mad_eps)[1]

    @abc.abstractmethod
    def log_probs(self, policy: TP, units: TU) -> torch.Tensor:
        """``[U, T]`` log-probs of the scored tokens of ``units`` under the active model."""

    @abc.abstractmethod
    def counted(self, units: TU) -> torch.Tensor:
        """``[U, T]`` bool, the tokens of ``units`` that enter the loss."""

    def extra_metrics(self, units: TU) -> dict[str, torch.Tensor]:
        """Further metrics of a minibatch (means over its units)."""
        del units
        return {}

    def loss_tokens(self, units: TU) -> int | None:
        if self.config.aggregation != "token_mean":
            return None
        return int(self.counted(units).sum())

    def scores_old(self, units: int) -> bool:
        """Whether old log-probs need a forward of their own (see ``updates_once``)."""
        return not updates_once(self.train_config, units)

    def old_and_reference(self, policy: TP, units: TU) -> tuple[torch.Tensor, torch.Tensor]:
        """``[U, T]`` old log-probs (``[U, 0]`` when ``updates_once`` makes training's own
        forward on-policy) and reference log-probs (``[U, 0]`` without KL), 0 where not
        counted, in chunks of ``train.minibatch_size`` units: scoring costs at most one training
        minibatch of activation memory."""
        counted = self.counted(units)
        old = ref = counted[:, :0].float()
        size = self.train_config.train.minibatch_size

        def score() -> torch.Tensor:
            chunks = [
                self.log_probs(policy, units.select(slice(i, i + size)))
                for i in range(0, len(units), size)
            ]
            return torch.cat(chunks) * counted

        if self.scores_old(len(units)):
            old = score()
        if self.config.kl_beta > 0:
            with policy.reference():
                ref = score()
        return old, ref

    def loss(
        self, policy: TP, minibatch: TU, step: StepContext | None = None
    ) -> tuple[torch.Tensor, Metrics]:
        mb: Any = minibatch  # every token unit type has these fields
        return token_policy_loss(
            self.surrogate,
            self.log_probs(policy, mb),
            mb.old_log_probs,
            mb.ref_log_probs,
            mb.advantages,
            self.counted(mb),
            kl_beta=self.config.kl_beta,
            kl_estimator=self.config.kl_estimator,
            tokens_per_minibatch=step.tokens_per_minibatch if step is not None else None,
            extra=self.extra_metrics(mb),
        )


class TokenPolicyGradient(TokenObjective[CausalTokenPolicy, TokenRollout, TokenRollout]):
    """The GRPO family's objective over an ``AutoregressiveRollout``'s completions: one unit per
    completion, scored by a full forward with the rollout sampler's temperature."""

    def __init__(
        self,
        config: TokenPolicyGradientConfig,
        rollout: Any,
        train_config: Any,
        ratio_level: Literal["token", "sequence"] = "token",
    ) -> None:
        super().__init__(config, train_config, ratio_level)
        self.rollout = rollout

    def log_probs(self, policy: CausalTokenPolicy, units: TokenRollout) -> torch.Tensor:
        completion = units.input_ids[:, units.completion_start :]
        temperature = self.rollout.sampler.temperature
        return policy.token_log_probs(
            units.input_ids, units.attention_mask, completion, temperature, units.model_inputs
        )

    def counted(self, units: TokenRollout) -> torch.Tensor:
        return units.completion_mask

    def extra_metrics(self, units: TokenRollout) -> dict[str, torch.Tensor]:
        return {
            "completion_length": units.completion_mask.float().sum(1).mean(),
            "truncated_fraction": (~units.finished).float().mean(),
        }

    @torch.no_grad()
    def units(
        self, policy: CausalTokenPolicy, batch: TokenRollout, noise: RolloutNoise
    ) -> TokenRollout:
        """The completions with their old log-probs (the computation training repeats, so the
        first update is exactly on-policy) and reference log-probs."""
        del noise
        old, ref = self.old_and_reference(policy, batch)
        return dataclasses.replace(batch, old_log_probs=old, ref_log_probs=ref)


__all__ = [
    "TokenObjective",
    "TokenPolicyGradient",
    "TokenPolicyGradientConfig",
]
