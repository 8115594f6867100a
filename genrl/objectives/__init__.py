"""Objectives: what is learned from a rollout (phases 4 and 5), one contract
(``base.Objective``).

``flow_policy_gradient`` (Flow-GRPO's clipped steps; the step loss in ``flow_steps``),
``tree_policy_gradient`` (BranchGRPO's fused tree advantages; pruning in ``tree_pruning``),
``regression_objectives`` (RAM, GDRO, DiffusionNFT on noised endpoints; losses in
``regression_losses``, noising in ``regression``), ``tokens`` (the GRPO family) and
``masked_tokens`` (MaskGRPO and diffu-GRPO on corrupted views from ``dllm_estimators``).
"""

from genrl.objectives.base import Objective, StepContext, updates_once

__all__ = ["Objective", "StepContext", "updates_once"]
