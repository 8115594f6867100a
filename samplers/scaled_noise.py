"""A stochastic flow step whose noise is scaled while its drift stays put.

BranchGRPO's reference code (Fredreic1849/BranchGRPO, ``fastvideo/train_branchgrpo_flux.py``,
``flux_step_with_split``) widens the children of a split: it keeps the step's mean (the drift of
the base noise level ``eta``), draws ``x_next = mean + scale * std * noise`` and scores the sample
under the base density ``N(mean, std^2)``. This wrapper does that for any Gaussian flow step; with
``score="drawn"`` it scores under the density the sample was drawn from, ``N(mean, (scale std)^2)``.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch

from samplers.base import StepOutput, gaussian_log_prob, per_sample

SplitScore = Literal["base", "drawn"]


class _GaussianStep(Protocol):
    num_steps: int
    sigmas: torch.Tensor
    log_prob_reduction: Literal["mean", "sum"]

    @property
    def stochastic_steps(self) -> torch.Tensor: ...

    def reference_std(self, timestep_index: torch.Tensor, like: torch.Tensor) -> torch.Tensor: ...

    def step(
        self,
        model_output: torch.Tensor,
        timestep_index: int | torch.Tensor,
        sample: torch.Tensor,
        *,
        prev_sample: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
    ) -> StepOutput: ...


class ScaledNoiseSampler:
    """``base``'s step with its noise multiplied by ``scale``.

    Args:
        base: a Gaussian flow step (e.g. ``DanceSDESampler`` or ``FlowSDESampler``).
        scale: multiplier of the noise (the reference's ``--tree_split_noise_scale``); 1 gives
            ``base`` exactly.
        score: ``"base"`` scores a sample under ``base``'s density, as the reference does;
            ``"drawn"`` under ``N(mean, (scale * std)^2)``, the density it was drawn from.
    """

    stochastic = True

    def __init__(self, base: _GaussianStep, scale: float, score: SplitScore = "base") -> None:
        if not scale > 0:
            raise ValueError(f"noise scale must be positive, got {scale}")
        if score not in ("base", "drawn"):
            raise ValueError(f"score must be 'base' or 'drawn', got {score!r}")
        self.base = base
        self.scale = float(scale)
        self.score: SplitScore = score

    @property
    def num_steps(self) -> int:
        return self.base.num_steps

    @property
    def sigmas(self) -> torch.Tensor:
        return self.base.sigmas

    @property
    def log_prob_reduction(self) -> Literal["mean", "sum"]:
        return self.base.log_prob_reduction

    @property
    def stochastic_steps(self) -> torch.Tensor:
        return self.base.stochastic_steps

    def reference_std(self, timestep_index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return self.base.reference_std(timestep_index, like)

    def step(
        self,
        model_output: torch.Tensor,
        timestep_index: int | torch.Tensor,
        sample: torch.Tensor,
        *,
        prev_sample: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
    ) -> StepOutput:
        """Draw (or re-score ``prev_sample``) like ``base.step``, with the noise scaled."""
        if prev_sample is None:
            if noise is None:
                noise = torch.randn(sample.shape, generator=generator, device=sample.device)
            # base.step scores the draw under its own density: the reference's log-prob.
            out = self.base.step(model_output, timestep_index, sample, noise=self.scale * noise)
        else:
            out = self.base.step(model_output, timestep_index, sample, prev_sample=prev_sample)
        if self.score == "base":
            return out
        std = self.scale * out.std
        random = std > 0
        safe = per_sample(torch.where(random, std, torch.ones_like(std)), sample)
        log_prob = gaussian_log_prob(
            out.prev_sample.detach(), out.mean, safe, self.log_prob_reduction
        )
        log_prob = torch.where(random, log_prob, torch.zeros_like(log_prob))
        return StepOutput(prev_sample=out.prev_sample, log_prob=log_prob, mean=out.mean, std=std)


__all__ = ["ScaledNoiseSampler", "SplitScore"]
