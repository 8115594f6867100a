"""Masked-diffusion token rollouts (MaskGRPO, diffu-GRPO): completions revealed by unmasking.

A completion of ``generation.max_new_tokens`` tokens starts fully masked and is revealed over
``generation.diffusion_steps`` steps (``samplers/masked.py``). The rollout records the tokens,
which positions precede the end token, and the step at which each token was revealed (the
``trace`` estimator's views); which corrupted views are scored is the objective's choice.
"""

from __future__ import annotations

from typing import Any

import torch

from genrl.data.batches import MaskedSamples
from genrl.data.rng import RolloutNoise, Streams
from genrl.policies.protocols import MaskedTokenPolicy
from genrl.rollouts.base import OutputFn, Rollout
from genrl.rollouts.configs import UnmaskingConfig
from genrl.rollouts.tokens import EVAL_SEED_STRIDE, temperature_words
from samplers.masked import MaskedDiffusionSampler


class UnmaskingRollout(Rollout[MaskedTokenPolicy, MaskedSamples]):
    """Completions of a masked-diffusion LM.

    Args:
        train_config: the run's config (``generation``).
    """

    def __init__(self, train_config: Any) -> None:
        self.train_config = train_config
        g = train_config.generation
        self.length = g.max_new_tokens
        self.steps = g.diffusion_steps or g.max_new_tokens
        self.sampler = MaskedDiffusionSampler(
            self.steps, g.block_length, g.remasking, g.temperature
        )
        self.eval_sampler = MaskedDiffusionSampler(
            self.steps, g.block_length, g.remasking, g.eval_temperature
        )

    @torch.no_grad()
    def collect(
        self,
        policy: MaskedTokenPolicy,
        prompts: list[str],
        group_ids: torch.Tensor,
        noise: RolloutNoise,
    ) -> MaskedSamples:
        prompt_ids, prompt_mask = policy.encode_prompts(prompts)
        generator = noise.device_generator(Streams.TOKEN_SAMPLING, policy.device)
        out = policy.generate(prompt_ids, prompt_mask, self.sampler, self.length, generator)
        valid = up_to_end(out.tokens, policy.eos_token_ids)
        return MaskedSamples(
            prompts=list(prompts),
            completions=policy.decode(out.tokens, valid),
            group_ids=group_ids,
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            tokens=out.tokens,
            valid=valid,
            reveal_step=out.reveal_step,
            advantages=torch.zeros(len(prompts), device=out.tokens.device),
        )

    def outputs(self, policy: MaskedTokenPolicy, batch: MaskedSamples) -> list[str]:
        del policy
        return batch.completions

    def evaluation_outputs(
        self, policy: MaskedTokenPolicy, prompts: list[str], samples_per_prompt: int, seed: int
    ) -> OutputFn:
        del prompts, samples_per_prompt

        def outputs(chunk: list[str], index: slice) -> list[str]:
            prompt_ids, prompt_mask = policy.encode_prompts(chunk)
            generator = torch.Generator(policy.device)
            generator.manual_seed(seed * EVAL_SEED_STRIDE + index.start)
            out = policy.generate(
                prompt_ids, prompt_mask, self.eval_sampler, self.length, generator
            )
            valid = up_to_end(out.tokens, policy.eos_token_ids)
            return policy.decode(out.tokens, valid)

        return outputs

    def evaluation_sampling(self) -> str:
        g = self.train_config.generation
        blocks = "" if g.block_length is None else f" in blocks of {g.block_length}"
        return (
            f"{g.remasking} unmasking of {self.length} tokens in {self.steps} steps{blocks}, "
            + temperature_words(g.eval_temperature)
        )


def up_to_end(tokens: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """``[B, L]`` bool: positions up to and including the first end token (all without one)."""
    if not eos_token_ids:
        return torch.ones_like(tokens, dtype=torch.bool)
    is_end = torch.isin(tokens, torch.tensor(eos_token_ids, device=tokens.device)).long()
    after_end = (is_end.cumsum(dim=1) - is_end) > 0
    return ~after_end


__all__ = ["UnmaskingConfig", "UnmaskingRollout", "up_to_end"]
