"""The GRPO family for token policies: GRPO, Dr.GRPO, DAPO's loss, GSPO and RLOO.

Shao et al., "DeepSeekMath" (2024), eq. 3: sample a group of completions per prompt, normalise
each reward within its group, and maximise the PPO-clipped objective of every completion token,
optionally with a KL to the reference policy:

    A_i = (r_i - mean_g r) / (std_g r + eps)
    L = agg_{i,t} max(-A_i rho_{i,t}, -A_i clip(rho_{i,t}, 1 - eps_low, 1 + eps_high))
        + beta * agg_{i,t} KL_k3(pi_theta || pi_ref)_{i,t},      rho = pi_theta / pi_old.

The variants are settings of one config: Dr.GRPO (Liu et al. 2025) = ``std_mode=none`` with the
``constant`` aggregation; DAPO's loss (Yu et al. 2025) = ``clip_range_high=0.28`` with the
``token_mean`` aggregation and the overlong penalty reward; GSPO (Zheng et al. 2025) =
``ratio_level=sequence``; RLOO (Ahmadian et al. 2024) = ``advantage=rloo``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from genrl.advantages import sequence_advantages
from genrl.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    RolloutNoise,
    StepContext,
    register_algorithm,
    updates_once,
)
from genrl.losses import AGGREGATIONS, TokenClippedSurrogate, token_policy_loss
from genrl.overrides import ConfigError
from genrl.rollout import TokenRollout
from samplers.autoregressive import TokenSampler


@dataclass
class GRPOConfig(AlgorithmConfig):
    name: str = "grpo"
    """Registry name."""
    clip_range: float = 0.2
    """PPO epsilon, low side (and high side unless set); GRPO 0.2, GSPO 3e-4."""
    clip_range_high: float | None = None
    """Upper epsilon (DAPO clip-higher: 0.28; GSPO: 4e-4); None = ``clip_range``."""
    ratio_level: Literal["token", "sequence"] = "token"
    """``token`` (GRPO/DAPO) or ``sequence`` (GSPO: one length-normalised ratio per answer; pair
    it with ``aggregation=sequence_mean``, which verl's GSPO loss always uses)."""
    aggregation: Literal["sequence_mean", "token_mean", "bnpo", "sequence_sum", "constant"] = (
        "sequence_mean"
    )
    """Loss reduction over tokens (``genrl.losses.aggregate``): per-sequence mean (GRPO, TRL
    ``grpo``); token mean over the optimizer step's tokens on all processes (DAPO, TRL ``dapo``);
    token mean per minibatch (TRL ``bnpo``); mean of per-sequence token sums (verl
    ``seq-mean-token-sum``); token sum / (B * max_new_tokens) (Dr.GRPO)."""
    advantage: Literal["group", "rloo"] = "group"
    """``group``: z-score within the group (std per ``std_mode``); ``rloo``: leave-one-out."""
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

    def validate(self, train_config: Any = None) -> None:
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
                    "generation.temperature must be > 0 for GRPO: greedy rollouts give every "
                    "member of a group the same answer, hence zero advantages"
                )
            if train_config.train.group_size < 2:
                raise ConfigError("train.group_size must be >= 2: GRPO compares answers in a group")


@register_algorithm("grpo")
class GRPO(Algorithm):
    Config = GRPOConfig
    config: GRPOConfig

    def __init__(self, config: GRPOConfig, train_config: Any) -> None:
        super().__init__(config, train_config)
        g = train_config.generation
        self.sampler = TokenSampler(g.temperature, g.top_k, g.top_p)
        self.eval_sampler = TokenSampler(g.eval_temperature)
        self.surrogate = TokenClippedSurrogate(
            config.clip_range,
            config.clip_range_high,
            level=config.ratio_level,
            aggregation=config.aggregation,
            max_length=g.max_new_tokens,
            clip_ratio_c=config.clip_ratio_c,
        )

    # -- rollout ---------------------------------------------------------------------------------
    @torch.no_grad()
    def collect(
        self, policy: Any, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> TokenRollout:
        g = self.train_config.generation
        prompt_ids, prompt_mask = policy.encode_prompts(prompts)
        generator = noise.device_generator(31_337, policy.device)
        out = policy.generate(prompt_ids, prompt_mask, self.sampler, g.max_new_tokens, generator)
        mask = out.mask
        finished = out.finished
        if g.stop_strings:
            mask = policy.cut_at_stop_strings(out.tokens, mask, g.stop_strings)
            finished = finished | (mask.sum(1) < out.mask.sum(1))  # ended at a stop string
        input_ids = torch.cat([prompt_ids, out.tokens], dim=1)
        # Tokens after a stop string stay in the (causal) input but are not trained; they
        # cannot change the log-probs of the tokens before them.
        attention = torch.cat([prompt_mask, out.mask.long()], dim=1)
        start = prompt_ids.shape[1]
        # Old log-probs from a full forward, the computation training repeats (the sampler's
        # incremental ones differ in the last bits): the first update is then exactly on-policy.
        # When the iteration is one optimizer step, training's own forward gives them ([N, 0]).
        none = torch.zeros(len(prompts), 0, device=mask.device)
        old = none
        if not updates_once(self.train_config, len(prompts)):
            old = self._score(policy, input_ids, attention, start, mask)
        ref = none
        if self.config.kl_beta > 0:
            with policy.reference():
                ref = self._score(policy, input_ids, attention, start, mask)
        return TokenRollout(
            prompts=list(prompts),
            completions=policy.decode(out.tokens, mask),
            group_ids=group_ids,
            input_ids=input_ids,
            attention_mask=attention,
            completion_mask=mask,
            old_log_probs=old,
            ref_log_probs=ref,
            finished=finished,
            advantages=torch.zeros(len(prompts), device=mask.device),
        )

    def _score(
        self,
        policy: Any,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        start: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        size = self.train_config.train.minibatch_size
        chunks = [
            policy.token_log_probs(
                input_ids[i : i + size], attention[i : i + size], start, self.sampler
            )
            for i in range(0, len(input_ids), size)
        ]
        return torch.cat(chunks) * mask

    def final_outputs(self, policy: Any, rollout: TokenRollout) -> list[str]:
        del policy
        return rollout.completions

    def reward_metadata(self, rollout: TokenRollout) -> list[dict[str, Any]]:
        lengths = rollout.completion_lengths.tolist()
        finished = rollout.finished.tolist()
        return [
            {"completion_length": int(n), "finished": bool(f)}
            for n, f in zip(lengths, finished, strict=True)
        ]

    # -- advantages and loss -----------------------------------------------------------------------
    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        del prompts, inputs
        c = self.config
        return sequence_advantages(
            rewards,
            group_ids,
            c.advantage,
            c.std_mode,
            c.advantage_clip,
            eps=c.std_eps,
            std_estimator=c.std_estimator,
        )

    def training_units(self, rollout: TokenRollout, noise: RolloutNoise) -> TokenRollout:
        del noise
        return rollout

    def loss_tokens(self, units: TokenRollout) -> int | None:  # type: ignore[override]
        if self.config.aggregation != "token_mean":
            return None
        return int(units.completion_mask.sum())

    def loss(
        self, policy: Any, minibatch: TokenRollout, step: StepContext | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mb = minibatch
        tokens = step.tokens_per_minibatch if step is not None else None
        log_probs = policy.token_log_probs(
            mb.input_ids, mb.attention_mask, mb.completion_start, self.sampler
        )
        return token_policy_loss(
            self.surrogate,
            log_probs,
            mb.old_log_probs,
            mb.ref_log_probs,
            mb.advantages,
            mb.completion_mask,
            kl_beta=self.config.kl_beta,
            kl_estimator=self.config.kl_estimator,
            tokens_per_minibatch=tokens,
            extra={
                "completion_length": mb.completion_mask.float().sum(1).mean(),
                "truncated_fraction": (~mb.finished).float().mean(),
            },
        )

    # -- evaluation ------------------------------------------------------------------------------
    def evaluation_outputs(
        self, policy: Any, prompts: list[str], samples_per_prompt: int, seed: int
    ) -> Any:
        """Held-out completions at ``generation.eval_temperature`` (greedy by default), with a
        generator seeded from ``eval.seed`` and the chunk's position when sampling."""
        g = self.train_config.generation

        def outputs(chunk: list[str], index: slice) -> list[str]:
            prompt_ids, prompt_mask = policy.encode_prompts(chunk)
            generator = torch.Generator(policy.device).manual_seed(seed * 100_003 + index.start)
            out = policy.generate(
                prompt_ids, prompt_mask, self.eval_sampler, g.max_new_tokens, generator
            )
            mask = out.mask
            if g.stop_strings:
                mask = policy.cut_at_stop_strings(out.tokens, mask, g.stop_strings)
            return policy.decode(out.tokens, mask)

        return outputs
