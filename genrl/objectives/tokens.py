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
and an entropy bonus per token (``genrl.objectives.advantages.BetaValueTracker``, ``mssr_advantages``,
``entropy_shaped_advantages``).
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

from genrl.config.errors import ConfigError
from genrl.data.batches import Batch, TokenRollout
from genrl.data.rng import RolloutNoise
from genrl.objectives.advantages import (
    BetaValueTracker,
    clip_advantages,
    entropy_shaped_advantages,
    median_centered_advantages,
    mssr_advantages,
    sequence_advantages,
    validate_median_groups,
)
from genrl.objectives.base import Objective, StepContext, updates_once
from genrl.objectives.losses import AGGREGATIONS, Metrics, TokenClippedSurrogate, token_policy_loss
from genrl.objectives.mismatch import sampler_mismatch
from genrl.policies.protocols import CausalTokenPolicy, EntropyTokenPolicy, TokenPolicy, require

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
    """Loss reduction over tokens (``genrl.objectives.losses.aggregate``): per-sequence mean (GRPO, TRL
    ``grpo``); token mean over the optimizer step's tokens on all processes (DAPO, TRL ``dapo``);
    token mean per minibatch (TRL ``bnpo``); mean of per-sequence token sums (verl
    ``seq-mean-token-sum``); token sum / (B * max_new_tokens) (Dr.GRPO)."""
    advantage: Literal["group", "rloo", "median", "mssr"] = "group"
    """``group``: z-score within the group (std per ``std_mode``); ``rloo``: leave-one-out;
    ``median``: MC-GRPO (Kim 2026): groups of ``G + 1`` (an odd ``train.group_size``) centred on
    their median and scaled by its absolute deviation, the median sample left out of training
    (``genrl.objectives.advantages.median_centered_advantages``); ``mssr``: MSSR (Liu et al. 2025, arXiv
    2512.18215), one rollout per prompt (``train.group_size=1``, ``algorithm.name=grpo`` only):
    reward minus the prompt's tracked Beta baseline, normalised over the batch, plus a per-token
    entropy bonus (the ``mssr_*`` fields; ``std_mode``, ``std_estimator`` and ``std_eps`` are
    unused)."""
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
    mssr_rho: float = 0.9175
    """``advantage=mssr``: forgetting factor of the Beta baseline's update (``alpha <- rho alpha
    + o``). The released code (ruiiu/MSSR) adapts it between ``rho_min=0.875`` and
    ``rho_max=0.96`` from the KL to the reference and uses their midpoint 0.9175 without one;
    genrl keeps it fixed."""
    mssr_prior_count: float = 8.0
    """``advantage=mssr``: pseudo-outcomes ``N0`` of an unseen prompt's prior (released code:
    ``1 / (1 - rho_min) = 8``)."""
    mssr_v_init: float = 0.5
    """``advantage=mssr``: prior success probability of an unseen prompt (released code's
    ``mvsr_v_init``: 0.5)."""
    mssr_eps: float = 1e-6
    """``advantage=mssr``: floor of the batch variance that normalises advantages (released
    code's ``mvsr_eps``: 1e-6)."""
    mssr_entropy_alpha: float = 0.4
    """``advantage=mssr``: scale of the entropy bonus ``min(alpha H, |A| / kappa)`` (released
    MSSR config ``entropy_alpha``: 0.4, Cheng et al. 2025's value); 0 turns the shaping off,
    which is the paper's unstabilised single-rollout baseline (MVSR)."""
    mssr_entropy_kappa: float = 2.0
    """``advantage=mssr``: the bonus is at most ``|A| / kappa`` (released: ``entropy_kappa`` 2)."""
    tis_cap: float | None = None
    """Truncated importance sampling (Yao et al. 2025): weight each token's surrogate term by
    ``min(pi_old / mu, tis_cap)``, ``mu`` the rollout engine's sampling probability and
    ``pi_old`` training's recomputation (``genrl/objectives/mismatch.py``; verl's rollout
    correction uses 2). None: no correction; the mismatch is logged either way
    (``loss/mismatch_*``)."""
    mssr_entropy: Literal["full", "sampled"] = "full"
    """``advantage=mssr``: the per-token entropy ``H``: ``full``, the entropy of the whole
    sampling distribution ``-sum_v p_v log p_v`` (the definition the released code's docstring
    states), from the old-log-prob forward; ``sampled``, ``-p log p`` of the sampled token only,
    which is what the released code computes (``compute_token_entropy``)."""

    @property
    def group_free(self) -> bool:
        """Whether advantages need no group (MSSR's tracked baseline), so that
        ``train.group_size=1`` is allowed."""
        return self.advantage == "mssr"

    def validate_objective(self, train_config: Any = None, mssr: bool = False) -> None:
        """Raise ``ConfigError`` on a bad field; ``mssr``: whether this objective implements
        ``advantage=mssr`` (the causal LM's, which has the entropies the shaping needs)."""
        if self.advantage == "mssr":
            self._validate_mssr(train_config, mssr)
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
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ConfigError(f"algorithm.tis_cap must be > 0 (or null), got {self.tis_cap}")
        if train_config is not None:
            if train_config.generation.temperature <= 0:
                raise ConfigError(
                    "generation.temperature must be > 0: greedy rollouts give every member of a "
                    "group the same answer, hence zero advantages"
                )
            if self.advantage != "mssr" and train_config.train.group_size < 2:
                raise ConfigError("train.group_size must be >= 2: advantages compare a group")
            validate_median_groups(self.advantage, train_config.train.group_size)

    def _validate_mssr(self, train_config: Any, supported: bool) -> None:
        if not supported:
            raise ConfigError(
                "algorithm.advantage=mssr is implemented for algorithm.name=grpo (causal LMs) only"
            )
        if not 0 < self.mssr_rho <= 1:
            raise ConfigError(f"algorithm.mssr_rho must be in (0, 1], got {self.mssr_rho}")
        if self.mssr_prior_count <= 0:
            raise ConfigError(
                f"algorithm.mssr_prior_count must be > 0, got {self.mssr_prior_count}"
            )
        if not 0 <= self.mssr_v_init <= 1:
            raise ConfigError(f"algorithm.mssr_v_init must be in [0, 1], got {self.mssr_v_init}")
        if self.mssr_eps < 0 or self.mssr_entropy_alpha < 0:
            raise ConfigError("algorithm.mssr_eps and mssr_entropy_alpha must be >= 0")
        if self.mssr_entropy_kappa <= 0:
            raise ConfigError(
                f"algorithm.mssr_entropy_kappa must be > 0, got {self.mssr_entropy_kappa}"
            )
        if self.mssr_entropy not in ("full", "sampled"):
            raise ConfigError(
                f"algorithm.mssr_entropy must be full or sampled, got {self.mssr_entropy!r}"
            )
        if train_config is None:
            return
        if train_config.train.group_size != 1:
            raise ConfigError(
                "algorithm.advantage=mssr is single-rollout: set train.group_size=1 (and spend "
                "the samples on more train.prompts_per_iteration); got "
                f"{train_config.train.group_size}"
            )
        if train_config.train.dynamic_sampling:
            raise ConfigError(
                "train.dynamic_sampling drops groups with one reward value, i.e. every group of "
                "one sample: it cannot be used with algorithm.advantage=mssr"
            )
        if train_config.reward_aggregation != "weighted_sum":
            raise ConfigError(
                "algorithm.advantage=mssr needs reward_aggregation=weighted_sum: "
                "normalize_then_sum normalises within groups, and groups here hold one sample"
            )


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
        MSSR's tracked-baseline ones (``genrl.objectives.advantages.mssr_advantages``; the per-token
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
            weights, mismatch = sampler_mismatch(
                trainer, sampled, self.counted(mb), self.config.tis_cap
            )
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
        ``A + min(alpha H_t, |A| / kappa)`` (``genrl.objectives.advantages.entropy_shaped_advantages``).

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
