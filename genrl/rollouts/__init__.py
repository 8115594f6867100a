"""Rollouts: how a process's samples are made (phase 2), one contract (``base.Rollout``).

``flow_sde`` (SDE windows: Flow-GRPO, -Fast, MixGRPO, DanceGRPO, CPS), ``tree`` (BranchGRPO's
branching trees), ``endpoints`` (clean ODE samples, optionally of a lagged copy: RAM, GDRO,
DiffusionNFT), ``tokens`` (autoregressive completions) and ``masked`` (masked-diffusion
unmasking); ``flow`` holds the flow rollouts' shared sampling and decoding helpers.

``configs`` holds every rollout's config section (``sampler.*``, ``generation.*``) without torch,
so that a config is checked before torch loads; the package imports nothing until a name is
used (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genrl.rollouts.base import OutputFn, Rollout

__all__ = ["OutputFn", "Rollout"]


def __getattr__(name: str) -> Any:
    """The contract's public names, imported on first access."""
    if name not in __all__:
        raise AttributeError(f"module 'genrl.rollouts' has no attribute {name!r}")
    value = getattr(importlib.import_module("genrl.rollouts.base"), name)
    globals()[name] = value
    return value
