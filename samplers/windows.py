"""Which steps of a trajectory are stochastic: ODE/SDE window schedules.

Flow-GRPO-Fast (Liu et al. 2025, "Flow-GRPO", section on Flow-GRPO-Fast) and MixGRPO (Li et al.
2025, "MixGRPO: Unlocking Flow-based GRPO Efficiency with Mixed ODE-SDE") sample most steps with
the deterministic ODE and only a short window with the SDE; only window steps carry a log-prob
and are trained, which shortens training by the ratio of window size to step count.
"""

from __future__ import annotations

from typing import Literal

import torch

WindowSchedule = Literal["random", "progressive"]


def sde_window_start(
    num_steps: int,
    window_size: int,
    schedule: WindowSchedule,
    iteration: int,
    generator: torch.Generator | None = None,
    start_range: tuple[int, int] | list[int] | None = None,
    stride: int = 1,
    shift_every: int = 25,
) -> int:
    """First step of this iteration's SDE window.

    Args:
        num_steps: steps ``T`` of the trajectory.
        window_size: ``k`` stochastic steps (``1 <= k <= T``).
        schedule: ``random``: uniform over ``start_range`` (inclusive), drawn from ``generator``;
            ``progressive``: ``min(iteration // shift_every * stride, T - k)`` (MixGRPO's
            sliding window, which then stays at the end).
        iteration: the training iteration (used by ``progressive``).
        start_range: ``[first, last]`` allowed starts for ``random``; None = ``[0, T - k]``.
    """
    if not 1 <= window_size <= num_steps:
        raise ValueError(f"window_size must lie in [1, {num_steps}], got {window_size}")
    last_start = num_steps - window_size
    if schedule == "progressive":
        return min(iteration // shift_every * stride, last_start)
    if schedule != "random":
        raise ValueError(f"unknown window schedule {schedule!r} (random or progressive)")
    first, last = start_range if start_range is not None else (0, last_start)
    if not 0 <= first <= last <= last_start:
        raise ValueError(f"window start range [{first}, {last}] outside [0, {last_start}]")
    return first + int(torch.randint(last - first + 1, (1,), generator=generator))


def sde_window_mask(num_steps: int, window_size: int, start: int) -> torch.Tensor:
    """``[T]`` bool, True on the ``window_size`` steps from ``start``; ``window_size = 0`` means
    every step is stochastic (a plain SDE rollout)."""
    if window_size == 0:
        return torch.ones(num_steps, dtype=torch.bool)
    mask = torch.zeros(num_steps, dtype=torch.bool)
    mask[start : start + window_size] = True
    return mask
