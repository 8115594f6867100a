"""Unmasking samplers for masked-diffusion language models (LLaDA-style).

Nie et al., "Large Language Diffusion Models" (LLaDA, 2025), section 2.4 and appendix B: the
answer starts fully masked; each step predicts every masked token and reveals a few of them,
either the most confident (low-confidence remasking) or random ones, optionally block by block
from left to right (semi-autoregressive). Predictions are drawn by Gumbel-max at a temperature
(0 = argmax). The sampler records the step at which every token was revealed, which is all that
is needed to rebuild each intermediate state (trace-based likelihoods, TraceRL).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from samplers.masked_schedule import tokens_per_step as tokens_per_step
from samplers.masked_schedule import unmasking_schedule

Remasking = Literal["low_confidence", "random"]


@dataclass
class MaskedGeneration:
    """Output of ``MaskedDiffusionSampler.generate``.

    Attributes:
        tokens: ``[B, L]`` the completion, every position revealed.
        reveal_step: ``[B, L]`` long, the step (0-based) at which each token was revealed.
        num_steps: total steps; the state before step ``s`` holds the tokens with
            ``reveal_step < s`` and the mask token elsewhere.
    """

    tokens: torch.Tensor
    reveal_step: torch.Tensor
    num_steps: int

    def state_before(self, step: int, mask_token_id: int) -> torch.Tensor:
        """``[B, L]`` completion as the model saw it at the start of ``step``."""
        hidden = self.reveal_step >= step
        return self.tokens.masked_fill(hidden, mask_token_id)


# (input_ids [B, P + L]) -> logits [B, *, V] whose last L positions are the completion's (a
# text model returns every position, an image model only its L image tokens)
LogitsFn = Callable[[torch.Tensor], torch.Tensor]


class UnmaskingSampler(abc.ABC):
    """Reveals a fixed-length completion that starts fully masked, recording each token's
    reveal step: LLaDA's text sampler here, the image samplers in ``samplers/masked_image.py``."""

    steps: int

    @abc.abstractmethod
    def generate(
        self,
        logits_fn: LogitsFn,
        prompt_ids: torch.Tensor,
        length: int,
        mask_token_id: int,
        generator: torch.Generator | None = None,
    ) -> MaskedGeneration:
        """Sample ``[B, length]`` completions after ``prompt_ids [B, P]``."""


class MaskedDiffusionSampler(UnmaskingSampler):
    """Reveal a fixed-length completion in ``steps`` steps.

    Args:
        steps: total denoising steps over the whole completion.
        block_length: semi-autoregressive block size; None = one block (the whole completion).
        remasking: ``low_confidence`` reveals the tokens whose sampled prediction is most
            probable; ``random`` reveals random masked positions.
        temperature: Gumbel-max temperature of the predictions (0 = argmax).
    """

    def __init__(
        self,
        steps: int,
        block_length: int | None = None,
        remasking: Remasking = "low_confidence",
        temperature: float = 0.0,
    ) -> None:
        if remasking not in ("low_confidence", "random"):
            raise ValueError(f"remasking must be 'low_confidence' or 'random', got {remasking!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.steps, self.block_length = steps, block_length
        self.remasking, self.temperature = remasking, float(temperature)

    def schedule(self, length: int) -> list[tuple[int, int, int]]:
        """``(block start, block end, tokens to reveal)`` for every step."""
        return unmasking_schedule(self.steps, self.block_length, length)

    @torch.no_grad()
    def generate(
        self,
        logits_fn: LogitsFn,
        prompt_ids: torch.Tensor,
        length: int,
        mask_token_id: int,
        generator: torch.Generator | None = None,
    ) -> MaskedGeneration:
        """Sample ``[B, length]`` completions after ``prompt_ids [B, P]``."""
        batch, device = prompt_ids.shape[0], prompt_ids.device
        completion = torch.full((batch, length), mask_token_id, dtype=torch.long, device=device)
        reveal = torch.full((batch, length), -1, dtype=torch.long, device=device)
        positions = torch.arange(length, device=device)
        schedule = self.schedule(length)
        for step, (start, end, count) in enumerate(schedule):
            logits = logits_fn(torch.cat([prompt_ids, completion], dim=1))[:, -length:].float()
            # Revealing a mask token would leave the position masked: never predict it.
            logits[..., mask_token_id] = float("-inf")
            predicted, confidence = self._predict(logits, generator)
            masked = completion == mask_token_id
            eligible = masked & (positions >= start) & (positions < end)
            if self.remasking == "random":
                confidence = torch.rand(confidence.shape, generator=generator, device=device)
            score = confidence.masked_fill(~eligible, float("-inf"))
            chosen = score.topk(count, dim=-1).indices  # [B, count]
            take = torch.zeros_like(masked).scatter(1, chosen, True) & eligible
            completion = torch.where(take, predicted, completion)
            reveal = torch.where(take, torch.full_like(reveal, step), reveal)
        return MaskedGeneration(tokens=completion, reveal_step=reveal, num_steps=len(schedule))

    def _predict(
        self, logits: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled token per position and the model's probability of it."""
        if self.temperature > 0:
            uniform = torch.rand(logits.shape, generator=generator, device=logits.device)
            exponential = (-torch.log(uniform.clamp(min=1e-20))).clamp(min=1e-20)
            gumbel = -torch.log(exponential)  # Gumbel(0, 1): argmax samples softmax(logits / T)
            predicted = (logits / self.temperature + gumbel).argmax(dim=-1)
        else:
            predicted = logits.argmax(dim=-1)
        probs = logits.softmax(dim=-1)
        return predicted, probs.gather(-1, predicted.unsqueeze(-1)).squeeze(-1)
