"""Noise-level schedules for flow-matching models.

Convention (diffusers SD3/FLUX/Wan): ``x_s = (1 - s) * x0 + s * eps`` and the model predicts
``v = eps - x0``. Sampling walks ``s`` from 1 down to 0.
"""

from __future__ import annotations

import torch


def shift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """Time shift of SD3 (Esser et al. 2024, eq. 23): ``s' = shift*s / (1 + (shift-1)*s)``.

    ``shift = 1`` leaves the schedule unchanged; ``shift > 1`` spends more steps at high noise.
    This is the same mapping diffusers' ``FlowMatchEulerDiscreteScheduler`` applies with a static
    shift.
    """
    if shift <= 0:
        raise ValueError(f"shift must be positive, got {shift}")
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def flow_sigmas(num_steps: int, shift: float = 1.0) -> torch.Tensor:
    """``num_steps + 1`` noise levels from 1 down to exactly 0, float32, shape ``[num_steps + 1]``.

    Step ``i`` moves the sample from ``sigmas[i]`` to ``sigmas[i + 1]``.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {num_steps}")
    sigmas = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    return shift_sigmas(sigmas, shift).to(torch.float32)
