"""Objectives: what is learned from a rollout (phases 4 and 5), one contract
(``base.Objective``).

``flow_policy_gradient`` (Flow-GRPO's clipped steps; the step loss in ``flow_steps``),
``tree_policy_gradient`` (BranchGRPO's fused tree advantages; pruning in ``tree_pruning``),
``regression_objectives`` (RAM, GDRO, DiffusionNFT on noised endpoints; losses in
``regression_losses``, noising in ``regression``), ``tokens`` (the GRPO family) and
``masked_tokens`` (MaskGRPO and diffu-GRPO on corrupted views from ``dllm_estimators``).

The objectives' configs (``flow_configs``, ``regression_configs``, ``token_configs``) import no
torch, so that a config is checked before torch loads; the package imports nothing until a name
is used (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genrl.objectives.base import Objective, StepContext, updates_once

__all__ = ["Objective", "StepContext", "updates_once"]


def __getattr__(name: str) -> Any:
    """The contract's public names, imported on first access."""
    if name not in __all__:
        raise AttributeError(f"module 'genrl.objectives' has no attribute {name!r}")
    value = getattr(importlib.import_module("genrl.objectives.base"), name)
    globals()[name] = value
    return value
