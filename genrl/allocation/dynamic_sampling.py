"""Batch allocation: DAPO's dynamic sampling, which trains only on groups whose rewards differ.

A group whose samples all get the same reward has zero advantage under every group-relative
estimator, so it adds no gradient and only dilutes the batch (Yu et al. 2025, "DAPO", Sec. 3.2:
keep groups with ``0 < |{correct}| < G``, sample more until the batch is full). Each refill
round samples ``prompts_per_iteration`` further prompts (continuing the iteration's prompt stream,
with its own noise); rounds stop once every process holds its share of varied groups, and a hard
cap turns a task that is too easy or too hard for the current policy into a clear error instead
of an endless loop.

Every process keeps only the varied groups it sampled itself, so dynamic sampling needs whole
groups per process (``prompts_per_iteration`` divisible by the number of processes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from genrl.allocation.base import AllocationError
from genrl.config.errors import ConfigError
from genrl.data.batches import Batch


class DynamicSamplingError(AllocationError):
    """Too few groups with differing rewards within the round cap."""


def varied_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: True for the samples of groups whose rewards are not all equal.

    Args:
        rewards: ``[N]`` float rewards (or any score).
        group_ids: ``[N]`` long group ids (any integers).
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    size = int(inverse.max()) + 1 if len(inverse) else 0
    values = rewards.detach().double().cpu()
    inverse = inverse.cpu()
    highest = torch.full((size,), -torch.inf, dtype=torch.float64)
    lowest = torch.full((size,), torch.inf, dtype=torch.float64)
    highest = highest.scatter_reduce(0, inverse, values, "amax")
    lowest = lowest.scatter_reduce(0, inverse, values, "amin")
    return (highest > lowest)[inverse].to(group_ids.device)


def collect_varied_groups(
    collect_round: Callable[[int], Any],
    *,
    target_groups: int,
    group_size: int,
    max_rounds: int,
    metric: str,
    local: slice,
    min_over_processes: Callable[[int], int] = lambda n: n,
) -> tuple[Batch, list[Any]]:
    """Sample rounds until every process holds ``target_groups`` varied groups.

    Args:
        collect_round: ``round -> CollectedBatch`` of that round (rollout of this process with
            advantages filled; gathered ``scores`` and ``group_ids`` of all processes).
        target_groups: varied groups this process needs (its share of ``prompts_per_iteration``).
        group_size: samples per group.
        max_rounds: hard cap on rounds.
        metric: score whose within-group spread decides.
        local: this process's slice of each round's gathered batch.
        min_over_processes: the smallest count over all processes (identity on one process), so
            that every process stops after the same round.

    Returns:
        this process's training rollout (its first ``target_groups`` varied groups, in sampling
        order) and the rounds' collected batches (for metrics).
    """
    parts: list[Batch] = []
    rounds: list[Any] = []
    have = 0
    for round_index in range(max_rounds):
        batch = collect_round(round_index)
        rounds.append(batch)
        if metric not in batch.scores:
            raise ConfigError(
                f"train.dynamic_sampling_metric={metric!r} is not a reward score; "
                f"scores are: {', '.join(batch.scores)}"
            )
        keep = varied_groups(batch.scores[metric], batch.group_ids)[local].cpu()
        parts.append(batch.rollout.select(keep.nonzero()[:, 0]))
        have += int(keep.sum()) // group_size
        if min_over_processes(have) >= target_groups:
            rollout = type(parts[0]).concatenate(parts)
            return rollout.select(slice(0, target_groups * group_size)), rounds
    generated = sum(len(b.group_ids) for b in rounds) // group_size
    raise DynamicSamplingError(
        f"dynamic sampling: after {max_rounds} rounds ({generated} groups sampled) a process "
        f"has {have} of the {target_groups} groups it needs whose {metric!r} differs within "
        "the group; the task is too easy or too hard for the current policy. Raise "
        "train.dynamic_sampling_max_rounds, lower train.prompts_per_iteration, or set "
        "train.dynamic_sampling=false."
    )


__all__ = ["DynamicSamplingError", "collect_varied_groups", "varied_groups"]
