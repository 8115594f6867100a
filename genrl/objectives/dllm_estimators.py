"""Likelihood estimators for masked-diffusion LMs: which corrupted inputs a completion's
log-probs are read from, and which tokens count.

A masked-diffusion LM has no tractable sequence likelihood; RL methods score tokens under a
corruption of the sampled sequence instead. Each estimator turns one rollout sample into
"views": a corrupted input (prompt + completion with some positions masked) and the completion
positions whose ``log p(token | view)`` enter the loss. Every view is a pure function of an
integer seed, so the old, current and reference policies score exactly the same corruption.

* ``d1`` (Zhao et al. 2025, "d1", diffu-GRPO section): the completion fully masked and each
  prompt token masked with probability 0.15; every completion token counts (mean-field).
* ``maskgrpo`` (MaskGRPO): a mask ratio rising over the inner iterations,
  ``t_j = min(m + (1 - m)(j + 1) / mu, 0.999)``, applied with "fading-out" masking for text:
  keep probability ``p_n = min(1, d_n (1 - t) L / sum d)`` with ``d = linspace(1, 0, L)``, so
  later tokens are masked more often; for images uniformly, every token masked with
  probability ``t_j`` (no order among image tokens); only re-masked tokens count (after the
  end token too, as in the released code); the prompt is never masked.
* ``random_ratio`` (UniGRPO, MMaDA): a ratio ``t ~ U[0.1, 0.9]`` per sample, each completion
  token masked with probability ``t``; masked tokens count.
* ``trace`` (TraceRL): each token scored in the state in which the sampler revealed it, one
  view per sampling step (exact for the sampler's own trajectory, ``steps`` forwards).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch


@dataclass
class MaskedView:
    """One corrupted input per sample.

    Attributes:
        completion: ``[B, L]`` the completion as the model sees it (mask token where hidden).
        prompt: ``[B, P]`` the prompt as the model sees it.
        counted: ``[B, L]`` bool, the completion positions whose log-prob enters the loss.
    """

    prompt: torch.Tensor
    completion: torch.Tensor
    counted: torch.Tensor


class LikelihoodEstimator(abc.ABC):
    """Builds the views of a batch for inner iteration ``iteration`` of ``num_iterations``."""

    name: str = ""

    @abc.abstractmethod
    def views(
        self,
        prompt: torch.Tensor,
        completion: torch.Tensor,
        valid: torch.Tensor,
        reveal_step: torch.Tensor,
        mask_token_id: int,
        seed: int,
        iteration: int,
        num_iterations: int,
    ) -> list[MaskedView]:
        """Args: ``prompt [B, P]`` ids, ``completion [B, L]`` sampled ids, ``valid [B, L]`` the
        completion tokens that are part of the answer (up to the end token), ``reveal_step
        [B, L]`` the sampler's reveal steps."""

    @staticmethod
    def generator(seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed % (2**63 - 1))


class OneStepEstimator(LikelihoodEstimator):
    """d1: completion fully masked, prompt tokens masked with ``prompt_mask_prob``."""

    name = "d1"

    def __init__(self, prompt_mask_prob: float = 0.15) -> None:
        self.prompt_mask_prob = prompt_mask_prob

    def views(
        self, prompt, completion, valid, reveal_step, mask_token_id, seed, iteration, num_iterations
    ):
        del reveal_step, iteration, num_iterations
        draw = torch.rand(prompt.shape, generator=self.generator(seed)).to(prompt.device)
        masked_prompt = prompt.masked_fill(draw < self.prompt_mask_prob, mask_token_id)
        return [
            MaskedView(masked_prompt, torch.full_like(completion, mask_token_id), valid.clone())
        ]


class FadingMaskEstimator(LikelihoodEstimator):
    """MaskGRPO's rising mask ratio with fading-out (text) or uniform (images) masking;
    re-masked tokens count.

    With ``fading=False`` every completion token is masked with probability ``t_j``, as the
    released code re-masks image tokens (``remask_t2i``: ``rand < ratio``); the fading curve
    is the text setting (``remask_ar``), since a raster order of image tokens has no
    left-to-right dependency for it to follow.

    With ``count_tail`` (the released code's behaviour: its loss mask is the re-masking mask,
    ``grpo/mask_grpo_trainer.py`` of martian422/MaskGRPO) positions after the end token are
    masked and counted like the others, so a view never shows where the answer ends; without
    it they stay visible and uncounted.
    """

    name = "maskgrpo"

    def __init__(
        self, ratio_floor: float = 0.6, count_tail: bool = True, fading: bool = True
    ) -> None:
        if not 0 <= ratio_floor < 1:
            raise ValueError(f"mask ratio floor must lie in [0, 1), got {ratio_floor}")
        self.ratio_floor = ratio_floor
        self.count_tail = count_tail
        self.fading = fading

    def mask_ratio(self, iteration: int, num_iterations: int) -> float:
        m = self.ratio_floor
        return min(m + (1 - m) * (iteration + 1) / num_iterations, 0.999)

    def keep_probabilities(self, length: int, ratio: float) -> torch.Tensor:
        """``[L]`` keep probability per position: fading from the first to the last token."""
        decay = torch.linspace(1, 0, length, dtype=torch.float64)
        return (decay * (1 - ratio) * length / decay.sum()).clamp(max=1).float()

    def views(
        self, prompt, completion, valid, reveal_step, mask_token_id, seed, iteration, num_iterations
    ):
        del reveal_step
        ratio = self.mask_ratio(iteration, num_iterations)
        draw = torch.rand(completion.shape, generator=self.generator(seed))
        if self.fading:
            hidden = draw >= self.keep_probabilities(completion.shape[1], ratio)
        else:
            hidden = draw < ratio
        hidden = hidden.to(completion.device)
        if not self.count_tail:
            hidden &= valid
        return [MaskedView(prompt, completion.masked_fill(hidden, mask_token_id), hidden)]


class RandomRatioEstimator(LikelihoodEstimator):
    """UniGRPO: ratio ``t ~ U[low, high]`` per sample; masked completion tokens count."""

    name = "random_ratio"

    def __init__(self, low: float = 0.1, high: float = 0.9) -> None:
        if not 0 < low <= high < 1:
            raise ValueError(f"need 0 < low <= high < 1, got {low}, {high}")
        self.low, self.high = low, high

    def views(
        self, prompt, completion, valid, reveal_step, mask_token_id, seed, iteration, num_iterations
    ):
        del reveal_step, iteration, num_iterations
        generator = self.generator(seed)
        ratio = self.low + (self.high - self.low) * torch.rand(
            completion.shape[0], 1, generator=generator
        )
        hidden = (torch.rand(completion.shape, generator=generator) < ratio).to(completion.device)
        hidden &= valid
        return [MaskedView(prompt, completion.masked_fill(hidden, mask_token_id), hidden)]


class TraceEstimator(LikelihoodEstimator):
    """TraceRL: the tokens revealed at step ``s`` are scored in the state before step ``s``.

    One view per sampling step: ``num_iterations`` steps (the sampler's step count), or more if
    the trace shows more; a step that revealed nothing (possible with the emerge sampler) gives
    a view with no counted token, so the number of views stays the objective's."""

    name = "trace"

    def views(
        self, prompt, completion, valid, reveal_step, mask_token_id, seed, iteration, num_iterations
    ):
        del seed, iteration
        steps = max(int(reveal_step.max()) + 1, num_iterations)
        views = []
        for step in range(steps):
            state = completion.masked_fill(reveal_step >= step, mask_token_id)
            views.append(MaskedView(prompt, state, (reveal_step == step) & valid))
        return views


ESTIMATORS: dict[str, type[LikelihoodEstimator]] = {
    cls.name: cls
    for cls in (OneStepEstimator, FadingMaskEstimator, RandomRatioEstimator, TraceEstimator)
}
