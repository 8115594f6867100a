"""MaskGRPO: GRPO for masked-diffusion LMs with importance ratios on re-masked tokens.

The completions of a group are sampled by unmasking (``samplers/masked.py``); rewards become
group advantages as in GRPO. A masked-diffusion LM has no exact sequence likelihood, so each
rollout sample is scored under ``num_iterations`` seeded corruptions ("views", from a pluggable
``genrl.dllm_estimators`` estimator): MaskGRPO's rising mask ratio with fading-out masking by
default, d1's one-step estimator in ``diffu_grpo``. Old and reference log-probs of every view are
computed once at rollout time, so the current policy is compared on exactly the same corrupted
inputs, with the core's token-level clipped surrogate and k3 KL:

    L = agg_{views, counted t} max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))
        + beta * agg KL_k3,     rho_t = p_theta(x_t | view) / p_old(x_t | view).

Every (sample, view) pair is a training unit; ``train.inner_epochs`` passes over all of them.
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
from genrl.dllm_estimators import ESTIMATORS, LikelihoodEstimator
from genrl.losses import AGGREGATIONS, TokenClippedSurrogate, token_policy_loss
from genrl.overrides import ConfigError
from genrl.rollout import MaskedRollout, MaskedUnits
from samplers.masked import MaskedDiffusionSampler

MASK_SEED_TAG = 40_000


@dataclass
class MaskGRPOConfig(AlgorithmConfig):
    name: str = "mask_grpo"
    """Registry name."""
    estimator: Literal["maskgrpo", "d1", "random_ratio", "trace"] = "maskgrpo"
    """Likelihood estimator (``genrl/dllm_estimators.py``)."""
    num_iterations: int = 12
    """Corrupted views per rollout sample (MaskGRPO's and d1's inner iterations, mu: 12 in both
    released recipes). The ``trace`` estimator is deterministic and uses one."""
    mask_ratio_floor: float = 0.6
    """MaskGRPO: first mask ratio ``m`` of ``t_j = m + (1 - m)(j + 1)/mu`` (text: 0.6)."""
    post_eos: Literal["count", "exclude"] = "count"
    """MaskGRPO's views: ``count`` masks and scores completion positions after the end token
    like any other, as the released code does (its loss mask is the re-masking mask), so a view
    does not reveal where the answer ends; ``exclude`` never masks or counts them."""
    prompt_mask_prob: float = 0.15
    """d1: probability of masking each prompt token."""
    clip_range: float = 0.2
    """PPO epsilon (MaskGRPO 0.2; d1 0.5)."""
    clip_range_high: float | None = None
    """Upper epsilon; None = ``clip_range``."""
    clip_ratio_c: float | None = None
    """Dual-clip bound (> 1) for negative advantages; None disables it."""
    aggregation: Literal["sequence_mean", "token_mean", "bnpo", "sequence_sum", "constant"] = "bnpo"
    """Reduction over counted tokens: both released codes take one token mean over the local
    minibatch (``bnpo``); see ``genrl.losses.aggregate`` for the others."""
    advantage: Literal["group", "rloo"] = "group"
    """Group z-score or leave-one-out."""
    std_mode: Literal["group", "global", "none"] = "group"
    """Advantage normaliser (d1: none, ``r - mean``)."""
    std_estimator: Literal["sample", "population"] = "sample"
    """Std of the normaliser (MaskGRPO: ``torch.std``, Bessel)."""
    std_eps: float = 1e-5
    """Added to the std (MaskGRPO: 1e-5)."""
    kl_beta: float = 0.01
    """Weight of the k3 KL to the reference on the same views (MaskGRPO 0.01, d1 0.04); 0
    skips it."""
    advantage_clip: float | None = None
    """Clamp advantages to +-this; None disables."""

    def validate(self, train_config: Any = None) -> None:
        if self.estimator not in ESTIMATORS:
            raise ConfigError(f"algorithm.estimator must be one of {sorted(ESTIMATORS)}")
        if self.num_iterations < 1:
            raise ConfigError("algorithm.num_iterations must be >= 1")
        if self.clip_range <= 0 or self.kl_beta < 0:
            raise ConfigError("algorithm.clip_range must be > 0 and kl_beta >= 0")
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(f"algorithm.aggregation must be one of {AGGREGATIONS}")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ConfigError(f"algorithm.clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.std_eps < 0:
            raise ConfigError(f"algorithm.std_eps must be >= 0, got {self.std_eps}")
        if train_config is not None:
            g = train_config.generation
            if g.temperature <= 0:
                raise ConfigError("generation.temperature must be > 0 so that a group differs")
            if train_config.train.group_size < 2:
                raise ConfigError("train.group_size must be >= 2")
            MaskedDiffusionSampler(g.diffusion_steps or g.max_new_tokens, g.block_length).schedule(
                g.max_new_tokens
            )


@register_algorithm("mask_grpo")
class MaskGRPO(Algorithm):
    Config = MaskGRPOConfig
    config: MaskGRPOConfig

    def __init__(self, config: MaskGRPOConfig, train_config: Any) -> None:
        super().__init__(config, train_config)
        g = train_config.generation
        steps = g.diffusion_steps or g.max_new_tokens
        self.sampler = MaskedDiffusionSampler(steps, g.block_length, g.remasking, g.temperature)
        self.eval_sampler = MaskedDiffusionSampler(
            steps, g.block_length, g.remasking, g.eval_temperature
        )
        self.estimator = self._make_estimator()
        self.surrogate = TokenClippedSurrogate(
            config.clip_range,
            config.clip_range_high,
            aggregation=config.aggregation,
            max_length=g.max_new_tokens,
            clip_ratio_c=config.clip_ratio_c,
        )

    def _make_estimator(self) -> LikelihoodEstimator:
        c = self.config
        options: dict[str, dict[str, Any]] = {
            "maskgrpo": {"ratio_floor": c.mask_ratio_floor, "count_tail": c.post_eos == "count"},
            "d1": {"prompt_mask_prob": c.prompt_mask_prob},
        }.get(c.estimator, {})
        return ESTIMATORS[c.estimator](**options)

    # -- rollout ---------------------------------------------------------------------------------
    @torch.no_grad()
    def collect(
        self, policy: Any, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> MaskedRollout:
        length = self.train_config.generation.max_new_tokens
        prompt_ids, prompt_mask = policy.encode_prompts(prompts)
        generator = noise.device_generator(31_337, policy.device)
        out = policy.generate(prompt_ids, prompt_mask, self.sampler, length, generator)
        valid = _up_to_end(out.tokens, policy.eos_token_ids)
        attention = torch.cat([prompt_mask, torch.ones_like(out.tokens)], dim=1)
        iterations = 1 if self.config.estimator == "trace" else self.config.num_iterations
        views = []
        for j in range(iterations):
            seed = int(torch.randint(2**62, (1,), generator=noise.generator(MASK_SEED_TAG + j)))
            views += self.estimator.views(
                prompt_ids, out.tokens, valid, out.reveal_step, policy.mask_token_id,
                seed + noise.local.start, j, iterations,
            )  # fmt: skip
        inputs = torch.stack([torch.cat([v.prompt, v.completion], 1) for v in views], dim=1)
        counted = torch.stack([v.counted for v in views], dim=1)
        start = prompt_ids.shape[1]
        none = counted[..., :0].float()  # [N, V, 0]: not recorded
        old = none
        if not updates_once(self.train_config, self.num_units(len(prompts))):
            old = self._score(policy, inputs, attention, out.tokens, start) * counted
        ref = none
        if self.config.kl_beta > 0:
            with policy.reference():
                ref = self._score(policy, inputs, attention, out.tokens, start) * counted
        return MaskedRollout(
            prompts=list(prompts),
            completions=policy.decode(
                out.tokens.masked_fill(~valid, policy.tokenizer.pad_token_id)
            ),
            group_ids=group_ids,
            inputs=inputs,
            attention_mask=attention,
            targets=out.tokens,
            counted=counted,
            old_log_probs=old,
            ref_log_probs=ref,
            advantages=torch.zeros(len(prompts), device=counted.device),
        )

    def _score(
        self,
        policy: Any,
        inputs: torch.Tensor,
        attention: torch.Tensor,
        targets: torch.Tensor,
        start: int,
    ) -> torch.Tensor:
        """``[N, V, L]`` log-probs of the targets under every view."""
        n, v = inputs.shape[:2]
        flat = inputs.reshape(n * v, -1)
        rows = torch.arange(n, device=inputs.device).repeat_interleave(v)
        size = self.train_config.train.minibatch_size
        chunks = [
            policy.token_log_probs(
                flat[i : i + size],
                attention[rows[i : i + size]],
                targets[rows[i : i + size]],
                start,
            )
            for i in range(0, n * v, size)
        ]
        return torch.cat(chunks).reshape(n, v, -1)

    def final_outputs(self, policy: Any, rollout: MaskedRollout) -> list[str]:
        del policy
        return rollout.completions

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

    def num_units(self, num_samples: int) -> int:
        """Views per sample: one per inner iteration, or one per sampling step for ``trace``."""
        g = self.train_config.generation
        if self.config.estimator == "trace":
            return num_samples * (g.diffusion_steps or g.max_new_tokens)
        return num_samples * self.config.num_iterations

    def training_units(self, rollout: MaskedRollout, noise: RolloutNoise) -> MaskedUnits:
        del noise
        return rollout.units()

    def loss_tokens(self, units: MaskedUnits) -> int | None:  # type: ignore[override]
        if self.config.aggregation != "token_mean":
            return None
        return int(units.counted.sum())

    def loss(
        self, policy: Any, minibatch: MaskedUnits, step: StepContext | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mb = minibatch
        start = mb.inputs.shape[1] - mb.targets.shape[1]
        log_probs = policy.token_log_probs(mb.inputs, mb.attention_mask, mb.targets, start)
        return token_policy_loss(
            self.surrogate,
            log_probs,
            mb.old_log_probs,
            mb.ref_log_probs,
            mb.advantages,
            mb.counted,
            kl_beta=self.config.kl_beta,
            tokens_per_minibatch=step.tokens_per_minibatch if step is not None else None,
            extra={"counted_tokens": mb.counted.float().sum(1).mean()},
        )

    # -- evaluation ------------------------------------------------------------------------------
    def evaluation_outputs(
        self, policy: Any, prompts: list[str], samples_per_prompt: int, seed: int
    ) -> Any:
        length = self.train_config.generation.max_new_tokens

        def outputs(chunk: list[str], index: slice) -> list[str]:
            prompt_ids, prompt_mask = policy.encode_prompts(chunk)
            generator = torch.Generator(policy.device).manual_seed(seed * 100_003 + index.start)
            out = policy.generate(prompt_ids, prompt_mask, self.eval_sampler, length, generator)
            valid = _up_to_end(out.tokens, policy.eos_token_ids)
            return policy.decode(out.tokens.masked_fill(~valid, policy.tokenizer.pad_token_id))

        return outputs


def _up_to_end(tokens: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """``[B, L]`` bool: positions up to and including the first end token (all without one)."""
    if not eos_token_ids:
        return torch.ones_like(tokens, dtype=torch.bool)
    is_end = torch.isin(tokens, torch.tensor(eos_token_ids, device=tokens.device)).long()
    after_end = (is_end.cumsum(dim=1) - is_end) > 0
    return ~after_end
