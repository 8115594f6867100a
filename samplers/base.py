"""Shared pieces of every sampler: the step output type, the Gaussian log-density, sigma checks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

LogProbReduction = Literal["mean", "sum"]
LOG_PROB_REDUCTIONS: tuple[str, ...] = ("mean", "sum")

_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)


@dataclass
class StepOutput:
    """What one sampler step returns.

    Attributes:
        prev_sample: the next (less noisy) state, ``[B, *event]``, float32.
        log_prob: log-density of ``prev_sample`` under the step's transition, ``[B]``, reduced
            over the event dimensions by the sampler's ``log_prob_reduction``. Zeros for a
            deterministic step.
        mean: mean of the transition Gaussian, ``[B, *event]``.
        std: standard deviation of the transition, ``[B]`` (one value per sample). Zeros for a
            deterministic step.
    """

    prev_sample: torch.Tensor
    log_prob: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor


def reduce_event(values: torch.Tensor, reduction: LogProbReduction) -> torch.Tensor:
    """Reduce ``[B, *event]`` to ``[B]`` by mean or sum over all event dimensions."""
    dims = tuple(range(1, values.ndim))
    if reduction == "mean":
        return values.mean(dim=dims)
    if reduction == "sum":
        return values.sum(dim=dims)
    raise ValueError(f"log_prob_reduction must be one of {LOG_PROB_REDUCTIONS}, got {reduction!r}")


def gaussian_log_prob(
    value: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduction: LogProbReduction
) -> torch.Tensor:
    """Element-wise ``log N(value; mean, std^2)`` reduced to ``[B]``.

    Args:
        value, mean: ``[B, *event]``.
        std: broadcastable to ``value`` (typically ``[B, 1, ..., 1]``), strictly positive.
    """
    z = (value - mean) / std
    log_density = -0.5 * z.square() - torch.log(std) - _HALF_LOG_TWO_PI
    return reduce_event(log_density, reduction)


def per_sample(value: torch.Tensor | float | int, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a scalar or ``[B]`` tensor to ``[B, 1, ..., 1]`` matching ``like``'s rank."""
    value = torch.as_tensor(value, dtype=torch.float32, device=like.device)
    if value.ndim == 0:
        value = value.expand(like.shape[0])
    if value.shape[0] != like.shape[0]:
        raise ValueError(
            f"per-sample value has {value.shape[0]} entries but the batch has {like.shape[0]}"
        )
    return value.reshape(-1, *([1] * (like.ndim - 1)))


def check_sigmas(sigmas: torch.Tensor) -> torch.Tensor:
    """Validate a noise schedule and return it as float32: 1-D, at least 2 levels, strictly
    decreasing, inside [0, 1]."""
    sigmas = torch.as_tensor(sigmas, dtype=torch.float32)
    if sigmas.ndim != 1 or sigmas.numel() < 2:
        raise ValueError(
            f"sigmas must be a 1-D tensor of at least 2 levels, got {tuple(sigmas.shape)}"
        )
    if not bool((sigmas[1:] < sigmas[:-1]).all()):
        raise ValueError("sigmas must be strictly decreasing (noise level goes from 1 towards 0)")
    if float(sigmas[0]) > 1.0 or float(sigmas[-1]) < 0.0:
        raise ValueError("sigmas must lie in [0, 1]")
    return sigmas
