"""Masked-diffusion token rollouts (MaskGRPO, diffu-GRPO): completions revealed by unmasking.

A completion of ``generation.max_new_tokens`` tokens starts fully masked and is revealed over
``generation.diffusion_steps`` steps (``samplers/masked.py``). The rollout records the tokens,
which positions precede the end token, and the step at which each token was revealed (the
``trace`` estimator's views); which corrupted views are scored is the objective's choice.
"""

from __future__ import annotations

import abc
from typing import Any, TypeVar

import torch

from genrl.config.errors import ConfigError
from genrl.data.batches import MaskedSamples
from genrl.data.rng import RolloutNoise, Streams
from genrl.policies.protocols import MaskedTokenPolicy, UnmaskingPolicy
from genrl.rollouts.base import OutputFn, Rollout
from genrl.rollouts.configs import UnmaskingConfig
from genrl.rollouts.tokens import EVAL_SEED_STRIDE, temperature_words
from samplers.masked import MaskedDiffusionSampler, UnmaskingSampler

UP = TypeVar("UP", bound=UnmaskingPolicy)


class UnmaskingRolloutBase(Rollout[UP, MaskedSamples]):
    """What the unmasking rollouts share: fixed-length completions revealed by a sampler from
    ``generation.*``, the reveal steps recorded, fixed-seed held-out samples. A subclass says
    which samplers it runs and how its samples are decoded for the rewards.

    Args:
        train_config: the run's config (``generation``).
    """

    samplers: tuple[str, ...] = ()
    """The ``generation.sampler`` values this rollout runs."""

    def __init__(self, train_config: Any) -> None:
        self.train_config = train_config
        g = train_config.generation
        if g.sampler not in self.samplers:
            raise ConfigError(
                f"generation.sampler={g.sampler}: {self.kind} sample with "
                f"{' or '.join(self.samplers)}"
            )
        self.length = g.max_new_tokens
        self.steps = g.diffusion_steps or g.max_new_tokens

    kind: str = ""
    """What the policies are, for messages."""

    @abc.abstractmethod
    def sampler(self, policy: UP, temperature: float) -> UnmaskingSampler:
        """The sampler of ``generation.*`` at ``temperature`` for ``policy``."""

    @abc.abstractmethod
    def completions(self, policy: UP, tokens: torch.Tensor, valid: torch.Tensor) -> list[str]:
        """The text recorded with each sample (``MaskedSamples.completions``)."""

    @abc.abstractmethod
    def decoded(self, policy: UP, tokens: torch.Tensor, valid: torch.Tensor) -> Any:
        """What the rewards score: texts, or images ``[N, 3, H, W]``."""

    def valid(self, policy: UP, tokens: torch.Tensor) -> torch.Tensor:
        """``[B, L]`` bool, the completion tokens that are part of the sample."""
        return up_to_end(tokens, policy.eos_token_ids)

    @torch.no_grad()
    def collect(
        self,
        policy: UP,
        prompts: list[str],
        group_ids: torch.Tensor,
        noise: RolloutNoise,
    ) -> MaskedSamples:
        prompt_ids, prompt_mask = policy.encode_prompts(prompts)
        generator = noise.device_generator(Streams.TOKEN_SAMPLING, policy.device)
        sampler = self.sampler(policy, self.train_config.generation.temperature)
        out = policy.generate(prompt_ids, prompt_mask, sampler, self.length, generator)
        valid = self.valid(policy, out.tokens)
        return MaskedSamples(
            prompts=list(prompts),
            completions=self.completions(policy, out.tokens, valid),
            group_ids=group_ids,
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            tokens=out.tokens,
            valid=valid,
            reveal_step=out.reveal_step,
            advantages=torch.zeros(len(prompts), device=out.tokens.device),
        )

    def evaluation_outputs(
        self, policy: UP, prompts: list[str], samples_per_prompt: int, seed: int
    ) -> OutputFn:
        del prompts, samples_per_prompt
        sampler = self.sampler(policy, self.train_config.generation.eval_temperature)

        def outputs(chunk: list[str], index: slice) -> Any:
            prompt_ids, prompt_mask = policy.encode_prompts(chunk)
            generator = torch.Generator(policy.device)
            generator.manual_seed(seed * EVAL_SEED_STRIDE + index.start)
            out = policy.generate(prompt_ids, prompt_mask, sampler, self.length, generator)
            return self.decoded(policy, out.tokens, self.valid(policy, out.tokens))

        return outputs


class UnmaskingRollout(UnmaskingRolloutBase[MaskedTokenPolicy]):
    """Completions of a masked-diffusion LM (LLaDA's sampler, ``generation.sampler=llada``)."""

    samplers = ("llada",)
    kind = "masked-diffusion LMs"

    def sampler(self, policy: MaskedTokenPolicy, temperature: float) -> UnmaskingSampler:
        del policy
        g = self.train_config.generation
        return MaskedDiffusionSampler(self.steps, g.block_length, g.remasking, temperature)

    def completions(
        self, policy: MaskedTokenPolicy, tokens: torch.Tensor, valid: torch.Tensor
    ) -> list[str]:
        return policy.decode(tokens, valid)

    def decoded(
        self, policy: MaskedTokenPolicy, tokens: torch.Tensor, valid: torch.Tensor
    ) -> list[str]:
        return policy.decode(tokens, valid)

    def outputs(self, policy: MaskedTokenPolicy, batch: MaskedSamples) -> list[str]:
        del policy
        return batch.completions

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


__all__ = ["UnmaskingConfig", "UnmaskingRollout", "UnmaskingRolloutBase", "up_to_end"]
