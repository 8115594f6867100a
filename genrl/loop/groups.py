"""Group bookkeeping: expanding prompts into groups and gathering across processes.

A group is the ``group_size`` samples of one prompt. Group ids are global (unique across all
processes within one iteration). Each process holds a contiguous slice of the global sample list,
so a group may span two processes; rewards are gathered before advantages are computed, which
keeps the advantages identical for any number of processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from genrl.distributed.processes import gather
from genrl.objectives.advantages import group_moments

if TYPE_CHECKING:
    from accelerate import Accelerator


def expand_groups(prompts: list[str], group_size: int) -> tuple[list[str], torch.Tensor]:
    """Repeat each prompt ``group_size`` times, consecutively.

    Returns:
        the ``len(prompts) * group_size`` prompts and their ``[N]`` long group ids.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    expanded = [p for p in prompts for _ in range(group_size)]
    group_ids = torch.arange(len(prompts)).repeat_interleave(group_size)
    return expanded, group_ids


def gather_scores(
    scores: dict[str, torch.Tensor], accelerator: Accelerator | None
) -> dict[str, torch.Tensor]:
    """Gather every named score vector ``[n] -> [N]``."""
    return {name: gather(value, accelerator) for name, value in scores.items()}


def group_stats(values: torch.Tensor, group_ids: torch.Tensor) -> dict[str, float]:
    """Mean within-group std and the number of groups, for logging."""
    _, stds, _ = group_moments(values, group_ids)
    return {"group_std_mean": float(stds.mean()), "num_groups": float(stds.numel())}
