"""The allocation registry: ``allocation.name`` -> its policy class, imported when built.

Importing this module imports no torch (the config checks read ``ALLOCATIONS``).
"""

from __future__ import annotations

import importlib
from typing import Any

ALLOCATIONS: dict[str, str | None] = {
    "uniform": None,
    "pilot_commit": "genrl.allocation.pilot_commit:PilotCommit",
    "sorted_groups": "genrl.allocation.sorted_groups:SortedGroups",
    "adaptive_rollouts": "genrl.allocation.adaptive_rollouts:AdaptiveRollouts",
}
"""Name -> ``"module:Class"`` of its ``AllocationPolicy`` (None: the collector's own rule)."""


def build_allocation(
    config: Any,
    groups: int,
    group_size: int,
    default_metric: str,
    seed: int,
    training_prompts: list[Any],
) -> Any | None:
    """The ``AllocationPolicy`` that ``config`` (an ``AllocationConfig``) names, for a run of
    ``groups`` groups of ``group_size`` per iteration; None for ``uniform``."""
    target = ALLOCATIONS[config.name]
    if target is None:
        return None
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    metric = config.metric or default_metric
    return cls(getattr(config, config.name), groups, group_size, metric, seed, training_prompts)


__all__ = ["ALLOCATIONS", "build_allocation"]
