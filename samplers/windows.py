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
WindowRange = tuple[int, int] | list[int] | None


def possible_window_starts(
    num_steps: int,
    window_size: int,
    schedule: WindowSchedule,
    window_range: WindowRange = None,
    stride: int = 1,
) -> list[int]:
    """Every start the schedule can produce, in increasing order.

    ``random``: the window lies within steps ``[first, last)`` of ``window_range`` (the meaning
    of Flow-GRPO-Fast's ``sde_window_range``), so starts run from ``first`` to ``last - k``;
    ``progressive``: ``0, stride, 2 stride, ...`` up to ``T - k``, where it stays.
    """
    if not 1 <= window_size <= num_steps:
        raise ValueError(f"window_size must lie in [1, {num_steps}], got {window_size}")
    if schedule == "progressive":
        last_start = num_steps - window_size
        return sorted({min(k * stride, last_start) for k in range(last_start + 1)})
    if schedule != "random":
        raise ValueError(f"unknown window schedule {schedule!r} (random or progressive)")
    first, last = window_range if window_range is not None else (0, num_steps)
    if not (first >= 0 and first + window_size <= last <= num_steps):
        raise ValueError(
            f"window range [{first}, {last}) cannot hold a window of {window_size} steps "
            f"within {num_steps} steps"
        )
    return list(range(first, last - window_size + 1))


def sde_window_start(
    num_steps: int,
    window_size: int,
    schedule: WindowSchedule,
    iteration: int,
    generator: torch.Generator | None = None,
    window_range: WindowRange = None,
    stride: int = 1,
    shift_every: int = 25,
) -> int:
    """First step of this iteration's SDE window.

    Args:
        num_steps: steps ``T`` of the trajectory.
        window_size: ``k`` stochastic steps (``1 <= k <= T``).
        schedule: ``random``: uniform over ``possible_window_starts`` (drawn from
            ``generator``); ``progressive``: ``min(iteration // shift_every * stride, T - k)``
            (MixGRPO's sliding window, which then stays at the end).
        iteration: the training iteration (used by ``progressive``).
        window_range: ``[first, last)`` steps a random window lies within; None = all steps.
    """
    starts = possible_window_starts(num_steps, window_size, schedule, window_range, stride)
    if schedule == "progressive":
        return min(iteration // shift_every * stride, starts[-1])
    return starts[int(torch.randint(len(starts), (1,), generator=generator))]


def sde_window_mask(num_steps: int, window_size: int, start: int) -> torch.Tensor:
    """``[T]`` bool, True on the ``window_size`` steps from ``start``; ``window_size = 0`` means
    every step is stochastic (a plain SDE rollout)."""
    if window_size == 0:
        return torch.ones(num_steps, dtype=torch.bool)
    mask = torch.zeros(num_steps, dtype=torch.bool)
    mask[start : start + window_size] = True
    return mask
