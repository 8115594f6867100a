"""Deterministic flow-matching sampler: the Euler step of the probability-flow ODE."""

from __future__ import annotations

from collections.abc import Callable

import torch

from samplers.base import StepOutput, check_sigmas, per_sample


class FlowODESampler:
    """Euler steps of ``dx/ds = v(x, s)`` from ``s = 1`` to ``s = 0``.

    ``x_{s_next} = x_s + (s_next - s) * v``; the same update as diffusers'
    ``FlowMatchEulerDiscreteScheduler.step`` (also computed in float32). Deterministic, so the
    returned ``log_prob`` and ``std`` are zeros; a given ``prev_sample`` is returned unchanged so
    that the ODE can stand in wherever a stochastic step is expected (e.g. ODE parts of a
    mixed ODE/SDE schedule).

    Args:
        sigmas: ``[T + 1]`` noise levels, decreasing from 1 to 0 (see ``samplers.flow_sigmas``).
    """

    stochastic = False

    def __init__(self, sigmas: torch.Tensor) -> None:
        self.sigmas = check_sigmas(sigmas)

    @property
    def num_steps(self) -> int:
        return self.sigmas.numel() - 1

    @property
    def stochastic_steps(self) -> torch.Tensor:
        """``[T]`` bool, all False: no ODE step has a density to train on."""
        return torch.zeros(self.num_steps, dtype=torch.bool, device=self.sigmas.device)

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
        del generator, noise  # deterministic step: accepted for a uniform signature
        sample = sample.float()
        sigma, sigma_next = _sigma_pair(self.sigmas, timestep_index, sample)
        mean = sample + (sigma_next - sigma) * model_output.float()
        zeros = torch.zeros(sample.shape[0], device=sample.device)
        return StepOutput(
            prev_sample=mean if prev_sample is None else prev_sample,
            log_prob=zeros,
            mean=mean,
            std=zeros,
        )


def integrate(
    velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    sigmas: torch.Tensor,
) -> torch.Tensor:
    """Euler steps of the probability-flow ODE through ``sigmas`` from ``x`` (``[N, *event]``).

    ``velocity(x, sigma)`` gives ``v`` for states ``x`` at per-sample levels ``sigma [N]``.
    """
    sampler = FlowODESampler(sigmas)
    x = x.float()
    levels = sampler.sigmas.to(x.device)
    for i in range(sampler.num_steps):
        v = velocity(x, levels[i].expand(x.shape[0]))
        x = sampler.step(v, i, x).prev_sample
    return x


def _sigma_pair(
    sigmas: torch.Tensor, timestep_index: int | torch.Tensor, sample: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, s_next)`` for each sample, shaped ``[B, 1, ..., 1]``."""
    sigmas = sigmas.to(sample.device)
    index = torch.as_tensor(timestep_index, device=sample.device, dtype=torch.long)
    if bool((index < 0).any()) or bool((index >= sigmas.numel() - 1).any()):
        raise IndexError(f"timestep_index out of range [0, {sigmas.numel() - 2}]: {timestep_index}")
    return per_sample(sigmas[index], sample), per_sample(sigmas[index + 1], sample)
