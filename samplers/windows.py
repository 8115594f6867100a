"""Which steps of a trajectory are stochastic: ODE/SDE window schedules.

Flow-GRPO-Fast (Liu et al. 2025, "Flow-GRPO", section on Flow-GRPO-Fast) and MixGRPO (Li et al.
2025, "MixGRPO: Unlocking Flow-based GRPO Efficiency with Mixed ODE-SDE") sample most steps with
the deterministic ODE and only a short window with the SDE; only window steps carry a log-prob
and are trained, which shortens training by the ratio of window size to step count.

MixGRPO's released code (``fastvideo/utils/grpo_states.py``) keeps the window size fixed and
truncates the window at the end (its last start index is ``sampling_steps - 2``); here a window
always holds ``k`` steps, so its last start is ``T - k``.
"""

from __future__ import annotations

from typing import Literal

import torch

WindowSchedule = Literal["random", "progressive", "decay"]
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
    if schedule in ("progressive", "decay"):
        last_start = num_steps - window_size
        return sorted({min(k * stride, last_start) for k in range(last_start + 1)})
    if schedule != "random":
        raise ValueError(f"unknown window schedule {schedule!r} (random, progressive or decay)")
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
    wrap: bool = False,
    shift_every_min: int = 1,
) -> int:
    """First step of this iteration's SDE window.

    Args:
        num_steps: steps ``T`` of the trajectory.
        window_size: ``k`` stochastic steps (``1 <= k <= T``).
        schedule: ``random``: uniform over ``possible_window_starts`` (drawn from
            ``generator``); ``progressive``: the window moves ``stride`` steps later every
            ``shift_every`` iterations up to ``T - k`` (MixGRPO's sliding window); ``decay``: the
            same, with the interval shrinking as the window moves, linearly in its position from
            ``shift_every`` to ``shift_every_min`` (MixGRPO's ``decay`` strategy).
        iteration: the training iteration (used by the sliding schedules).
        window_range: ``[first, last)`` steps a random window lies within; None = all steps.
        wrap: past the last position a sliding window starts again at step 0 (MixGRPO's
            ``--roll_back``); otherwise it stays there.
    """
    starts = possible_window_starts(num_steps, window_size, schedule, window_range, stride)
    if schedule == "random":
        return starts[int(torch.randint(len(starts), (1,), generator=generator))]
    if schedule == "progressive":
        intervals = [shift_every] * len(starts)
    else:
        last = starts[-1] or 1
        intervals = [
            max(shift_every_min, int(shift_every * (1 - p / last) + shift_every_min * p / last))
            for p in starts
        ]
    return starts[_sliding_position(intervals, iteration, wrap)]


def _sliding_position(intervals: list[int], iteration: int, wrap: bool) -> int:
    """Index of the window position that ``iteration`` falls in when position ``i`` is held for
    ``intervals[i]`` iterations (then the next; after the last, the first again with ``wrap``)."""
    cycle = sum(intervals)
    if wrap:
        iteration %= cycle
    for index, length in enumerate(intervals):
        if iteration < length:
            return index
        iteration -= length
    return len(intervals) - 1


def sde_window_mask(num_steps: int, window_size: int, start: int) -> torch.Tensor:
    """``[T]`` bool, True on the ``window_size`` steps from ``start``; ``window_size = 0`` means
    every step is stochastic (a plain SDE rollout)."""
    if window_size == 0:
        return torch.ones(num_steps, dtype=torch.bool)
    mask = torch.zeros(num_steps, dtype=torch.bool)
    mask[start : start + window_size] = True
    return mask
