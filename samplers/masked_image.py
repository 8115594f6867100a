"""Unmasking samplers for masked image-token generators (MUSE / aMUSEd, MaskGIT-style).

An image is a grid of ``L`` VQ codebook indices that starts fully masked. Two samplers:

* ``MaskGITSampler``: aMUSEd's own (``diffusers.AmusedScheduler.step``; the iterative decoding
  of Chang et al., "MaskGIT", 2022, as Chang et al., "Muse", 2023, use it). Every step draws a token for every masked
  position from ``softmax(logits)``, then re-masks the ``floor(L * gamma((s + 1) / S))`` least
  confident of the newly drawn ones, ``gamma`` the cosine (or linear) masking schedule, with
  confidence ``log p(token) + tau_s * Gumbel`` and ``tau_s`` annealed linearly over the steps.
  Given the same ``torch.Generator`` it consumes the same random numbers in the same order as
  ``AmusedPipeline(...)``, so it reproduces the stock pipeline's tokens exactly.
* ``EmergeSampler``: MaskGRPO's "emerge" sampler for visual sequences (Ma et al.,
  "Consolidating Reinforcement Learning for Multimodal Discrete Diffusion Models", 2025, its
  rollout for visual sequences; ``t2i_generate_emerge`` in martian422/MaskGRPO
  ``grpo/mask_grpo_trainer.py``, whose README names it the "emerge sampler"). It is the
  absorbing-state reverse step of masked diffusion (as in MDLM, Sahoo et al. 2024): with mask rates
  ``k_t = gamma(s / S)`` before and ``k_s = gamma((s + 1) / S)`` after step ``s``, every still
  masked token stays masked with probability ``k_s / k_t`` and is otherwise drawn from
  ``softmax(logits / T)``, independently per position; the last step reveals all the rest.
  Unlike MaskGIT's confidence ranking it keeps no deterministic top-k choice, which gives the
  diverse completions a GRPO group needs.

Both record the step at which each token was revealed (``MaskedGeneration.reveal_step``); a
revealed token is never re-masked (carry-over unmasking), so the state before step ``s`` is the
tokens revealed earlier.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from samplers.masked import LogitsFn, MaskedGeneration, UnmaskingSampler

MaskingSchedule = Literal["cosine", "linear"]


def mask_rate(progress: torch.Tensor, schedule: MaskingSchedule) -> torch.Tensor:
    """``gamma(r)``: the fraction of tokens still masked after a fraction ``r`` of the steps
    (MaskGIT's cosine ``cos(pi r / 2)``, aMUSEd's default, or linear ``1 - r``)."""
    if schedule == "cosine":
        return torch.cos(progress * math.pi / 2)
    if schedule == "linear":
        return 1 - progress
    raise ValueError(f"masking schedule must be 'cosine' or 'linear', got {schedule!r}")


def _check(steps: int, length: int) -> None:
    if not 1 <= steps <= length:
        raise ValueError(f"steps must lie in [1, {length}] for {length} image tokens, got {steps}")


class MaskGITSampler(UnmaskingSampler):
    """aMUSEd's sampler (``AmusedScheduler``) as an unmasking sampler.

    Args:
        steps: sampling steps (``num_inference_steps``; aMUSEd's default 12).
        temperature: Gumbel temperature of the confidence at the first step; it falls linearly
            to ``final_temperature`` at the last (``AmusedPipeline(temperature=(2, 0))`` is the
            stock default; a single number ``t`` there means ``(t, 0.01)``).
        final_temperature: the temperature at the last step.
        schedule: the masking schedule (the checkpoint's ``scheduler.config.masking_schedule``).
    """

    def __init__(
        self,
        steps: int = 12,
        temperature: float = 2.0,
        final_temperature: float = 0.0,
        schedule: MaskingSchedule = "cosine",
    ) -> None:
        mask_rate(torch.zeros(()), schedule)  # refuses an unknown schedule now
        self.steps, self.schedule = steps, schedule
        self.temperature, self.final_temperature = float(temperature), float(final_temperature)

    @torch.no_grad()
    def generate(
        self,
        logits_fn: LogitsFn,
        prompt_ids: torch.Tensor,
        length: int,
        mask_token_id: int,
        generator: torch.Generator | None = None,
    ) -> MaskedGeneration:
        """``[B, length]`` image tokens; ``logits_fn`` returns guided codebook logits."""
        _check(self.steps, length)
        batch, device = prompt_ids.shape[0], prompt_ids.device
        sample = torch.full((batch, length), mask_token_id, dtype=torch.long, device=device)
        reveal = torch.full_like(sample, -1)
        # AmusedScheduler.set_timesteps: float32 linspace, indexed by the step.
        temperatures = torch.linspace(
            self.temperature, self.final_temperature, self.steps, device=device
        )
        for step in range(self.steps):
            logits = logits_fn(torch.cat([prompt_ids, sample], dim=1))[:, -length:].float()
            unknown = sample == mask_token_id
            probs = logits.softmax(dim=-1)
            drawn = _multinomial(probs, generator)
            predicted = torch.where(unknown, drawn, sample)
            if step == self.steps - 1:
                new = predicted
            else:
                new = self._remask(probs, predicted, unknown, step, temperatures, generator)
                new = torch.where(new, mask_token_id, predicted)
            revealed = unknown & (new != mask_token_id)
            reveal = torch.where(revealed, torch.full_like(reveal, step), reveal)
            sample = new
        return MaskedGeneration(tokens=sample, reveal_step=reveal, num_steps=self.steps)

    def _remask(
        self,
        probs: torch.Tensor,
        predicted: torch.Tensor,
        unknown: torch.Tensor,
        step: int,
        temperatures: torch.Tensor,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """``[B, L]`` bool, the drawn tokens masked again (AmusedScheduler.step's arithmetic,
        in its float32 tensor order, so that the counts and cut-offs are bit-identical)."""
        length = predicted.shape[1]
        step_index = torch.tensor([[step]], device=probs.device)
        ratio = (step_index + 1) / self.steps
        masked_len = (length * mask_rate(ratio, self.schedule)).floor()
        # Never more than were masked before (minus one), never fewer than one.
        masked_len = torch.min(unknown.sum(dim=-1, keepdim=True) - 1, masked_len)
        masked_len = torch.max(torch.tensor([1], device=probs.device), masked_len)
        chosen = torch.gather(probs, -1, predicted[:, :, None])[:, :, 0]
        chosen = torch.where(unknown, chosen, torch.finfo(chosen.dtype).max)
        confidence = torch.log(chosen.clamp(1e-20)) + temperatures[step_index] * _gumbel(
            chosen, generator
        )
        cut_off = torch.gather(torch.sort(confidence, dim=-1).values, 1, masked_len.long())
        return confidence < cut_off


class EmergeSampler(UnmaskingSampler):
    """MaskGRPO's emerge sampler (the masked-diffusion reverse step, independent per token).

    Args:
        steps: sampling steps (MaskGRPO's ``timesteps``, 12 by default).
        temperature: predictions are drawn from ``softmax(logits / temperature)`` (the released
            code uses 1); 0 draws the argmax.
        schedule: the mask-rate schedule ``gamma`` (MaskGRPO: cosine).
    """

    def __init__(
        self, steps: int = 12, temperature: float = 1.0, schedule: MaskingSchedule = "cosine"
    ) -> None:
        mask_rate(torch.zeros(()), schedule)
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.steps, self.temperature, self.schedule = steps, float(temperature), schedule

    def stay_masked(self, step: int) -> float:
        """``k_s / k_t``: the probability that a masked token stays masked through ``step``
        (0 at the last step, which reveals everything)."""
        if step == self.steps - 1:
            return 0.0
        progress = torch.tensor([step / self.steps, (step + 1) / self.steps], dtype=torch.float64)
        before, after = mask_rate(progress, self.schedule).tolist()
        return after / before

    @torch.no_grad()
    def generate(
        self,
        logits_fn: LogitsFn,
        prompt_ids: torch.Tensor,
        length: int,
        mask_token_id: int,
        generator: torch.Generator | None = None,
    ) -> MaskedGeneration:
        _check(self.steps, length)
        batch, device = prompt_ids.shape[0], prompt_ids.device
        sample = torch.full((batch, length), mask_token_id, dtype=torch.long, device=device)
        reveal = torch.full_like(sample, -1)
        for step in range(self.steps):
            logits = logits_fn(torch.cat([prompt_ids, sample], dim=1))[:, -length:].float()
            unknown = sample == mask_token_id
            if self.temperature == 0:
                probs = torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
            else:
                probs = (logits / self.temperature).softmax(dim=-1)
            stay = self.stay_masked(step)
            # One categorical over the codebook plus "stay masked" (the last entry), as the
            # released sampler draws it: p(v) (1 - k_s / k_t) for each v, k_s / k_t for the mask.
            joint = torch.cat([probs * (1 - stay), torch.full_like(probs[..., :1], stay)], dim=-1)
            drawn = _multinomial(joint, generator)
            revealed = unknown & (drawn < probs.shape[-1])
            sample = torch.where(revealed, drawn, sample)
            reveal = torch.where(revealed, torch.full_like(reveal, step), reveal)
        return MaskedGeneration(tokens=sample, reveal_step=reveal, num_steps=self.steps)


def _multinomial(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of ``probs [B, L, K]`` on the generator's device (as AmusedScheduler:
    a CPU generator draws on the CPU), returned on ``probs``' device."""
    device = generator.device if generator is not None else probs.device
    flat = probs.to(device).reshape(-1, probs.shape[-1])
    drawn = torch.multinomial(flat, 1, generator=generator)
    return drawn.to(probs.device)[:, 0].view(*probs.shape[:-1])


def _gumbel(like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Gumbel(0, 1) noise shaped like ``like``, drawn as ``diffusers.schedulers.
    scheduling_amused.gumbel_noise`` draws it (uniforms on the generator's device)."""
    device = generator.device if generator is not None else like.device
    noise = torch.zeros_like(like, device=device).uniform_(0, 1, generator=generator)
    noise = noise.to(like.device)
    return -torch.log((-torch.log(noise.clamp(1e-20))).clamp(1e-20))


__all__ = ["EmergeSampler", "MaskGITSampler", "mask_rate"]
