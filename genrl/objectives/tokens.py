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

``advantage=mssr`` replaces the group by MSSR's single-rollout advantages (Liu et al. 2025,
arXiv 2512.18215): a per-prompt Beta baseline tracked across iterations, batch normalisation,
and an entropy bonus per token (``genrl.objectives.single_rollout.BetaValueTracker``, ``mssr_advantages``,
``entropy_shaped_advantages``).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Literal, TypeVar

import torch

from genrl.data.batches import Batch, TokenRollout
from genrl.data.rng import RolloutNoise
from genrl.objectives.advantages import (
    clip_advantages,
    median_centered_advantages,
    sequence_advantages,
)
from genrl.objectives.base import Objective, StepContext, updates_once
from genrl.objectives.losses import Metrics, TokenClippedSurrogate, token_policy_loss
from genrl.objectives.mismatch import sampler_mismatch
from genrl.objectives.single_rollout import (
    BetaValueTracker,
    entropy_shaped_advantages,
    mssr_advantages,
)
from genrl.objectives.token_configs import TokenPolicyGradientConfig
from genrl.policies.protocols import CausalTokenPolicy, EntropyTokenPolicy, Policy, require

TP = TypeVar("TP", bound=Policy)  # token LMs, and the masked image-token models
TB = TypeVar("TB", bound=Batch)
TU = TypeVar("TU", bound=Batch)


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
        self.tracker: BetaValueTracker | None = None
        if config.advantage == "mssr":
            self.tracker = BetaValueTracker(
                config.mssr_rho, config.mssr_prior_count, config.mssr_v_init
            )

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
        """``[N]`` group-relative advantages (``genrl.objectives.advantages.sequence_advantages``), or
        MSSR's tracked-baseline ones (``genrl.objectives.single_rollout.mssr_advantages``; the per-token
        entropy bonus is added by ``units``)."""
        del inputs
        c = self.config
        estimator = c.advantage
        if estimator == "mssr":
            assert self.tracker is not None
            return clip_advantages(
                mssr_advantages(self.tracker, prompts, rewards, c.mssr_eps), c.advantage_clip
            )
        return sequence_advantages(
            rewards,
            group_ids,
            estimator,
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

    def state_dict(self) -> dict[str, Any]:
        """MSSR's tracker (nothing for the group estimators, which keep no state)."""
        return {} if self.tracker is None else {"mssr_tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.tracker is not None:
            self.tracker.load_state_dict(state["mssr_tracker"])

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
        """The token policy loss; where the units carry the rollout engine's log-probs, their
        mismatch with training's (the old log-probs, or this forward's when the iteration is
        one optimizer step and so still on the old weights) is logged and, with
        ``algorithm.tis_cap``, corrected by truncated importance weights."""
        mb: Any = minibatch  # every token unit type has these fields
        log_probs = self.log_probs(policy, mb)
        extra = self.extra_metrics(mb)
        weights = None
        sampled = getattr(mb, "sampler_log_probs", None)
        if sampled is not None:
            trainer = mb.old_log_probs if mb.old_log_probs.shape[-1] else log_probs.detach()
            counted = self.counted(mb)
            replayed = getattr(mb, "replayed", None)
            if replayed is not None:  # an earlier policy sampled them: not a kernel mismatch
                counted = counted & ~replayed[:, None]
            weights, mismatch = sampler_mismatch(trainer, sampled, counted, self.config.tis_cap)
            if weights is not None and replayed is not None:
                weights = torch.where(replayed[:, None], torch.ones_like(weights), weights)
            extra.update(mismatch)
        return token_policy_loss(
            self.surrogate,
            log_probs,
            mb.old_log_probs,
            mb.ref_log_probs,
            mb.advantages,
            self.counted(mb),
            kl_beta=self.config.kl_beta,
            kl_estimator=self.config.kl_estimator,
            tokens_per_minibatch=step.tokens_per_minibatch if step is not None else None,
            extra=extra,
            token_weights=weights,
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
        first update is exactly on-policy) and reference log-probs; with ``advantage=mssr``
        also their ``[N, T]`` entropy-shaped advantages (``mssr_units``)."""
        del noise
        if self.config.advantage == "mssr":
            return self.mssr_units(policy, batch)
        old, ref = self.old_and_reference(policy, batch)
        return dataclasses.replace(batch, old_log_probs=old, ref_log_probs=ref)

    def mssr_units(self, policy: CausalTokenPolicy, batch: TokenRollout) -> TokenRollout:
        """MSSR's units: the sequence advantages ``[N]`` become ``[N, T]``,
        ``A + min(alpha H_t, |A| / kappa)`` (``genrl.objectives.single_rollout.entropy_shaped_advantages``).

        ``H_t`` is the entropy of the policy that sampled the rollout, measured here, before
        any update, and fixed for the iteration's passes, as the released code takes it from
        the old log-probs; it is computed without gradients, so it is detached as the shaping
        requires. The old-log-prob forward yields it at the cost of one more pass over the
        vocabulary per position; when the iteration is one optimizer step (no old forward,
        ``updates_once``) that forward runs for the entropies alone.
        """
        c, counted = self.config, batch.completion_mask
        size = self.train_config.train.minibatch_size
        temperature = self.rollout.sampler.temperature
        completion = batch.input_ids[:, batch.completion_start :]
        if c.mssr_entropy == "full":
            scorer = require(policy, EntropyTokenPolicy, "grpo with algorithm.advantage=mssr")
            pieces = []
            for i in range(0, len(batch), size):
                chunk = batch.select(slice(i, i + size))
                pieces.append(
                    scorer.token_log_probs_and_entropies(
                        chunk.input_ids,
                        chunk.attention_mask,
                        completion[i : i + size],
                        temperature,
                        chunk.model_inputs,
                    )
                )
            log_probs = torch.cat([p[0] for p in pieces]) * counted
            entropies = torch.cat([p[1] for p in pieces]) * counted
        else:
            chunks = [
                self.log_probs(policy, batch.select(slice(i, i + size)))
                for i in range(0, len(batch), size)
            ]
            log_probs = torch.cat(chunks) * counted
            # -p log p of the sampled token; 0 off the mask, where log p was zeroed.
            entropies = -(log_probs.exp() * log_probs)
        old = log_probs if self.scores_old(len(batch)) else counted[:, :0].float()
        ref = counted[:, :0].float()
        if c.kl_beta > 0:
            with policy.reference():
                ref_chunks = [
                    self.log_probs(policy, batch.select(slice(i, i + size)))
                    for i in range(0, len(batch), size)
                ]
            ref = torch.cat(ref_chunks) * counted
        advantages = entropy_shaped_advantages(
            batch.advantages, entropies, counted, c.mssr_entropy_alpha, c.mssr_entropy_kappa
        )
        return dataclasses.replace(
            batch, old_log_probs=old, ref_log_probs=ref, advantages=advantages
        )


__all__ = [
    "TokenObjective",
    "TokenPolicyGradient",
    "TokenPolicyGradientConfig",
]
