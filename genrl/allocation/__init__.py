"""Allocation: how an iteration spends its rollout budget over prompts (``allocation.name``).

``uniform`` is the collector's own rule (``train.group_size`` samples per prompt, one round);
the others are ``AllocationPolicy`` classes (``base.py``), one per file, imported when built
(``registry.py``).
DAPO's dynamic sampling (``dynamic_sampling.py``, ``train.dynamic_sampling``) refills uniform
rounds and stays a switch of its own. Importing this package imports no torch.
"""

from __future__ import annotations

from genrl.allocation.registry import ALLOCATIONS, build_allocation

__all__ = ["ALLOCATIONS", "build_allocation"]
