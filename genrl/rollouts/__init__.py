"""Rollouts: how a process's samples are made (phase 2), one contract (``base.Rollout``).

``flow_sde`` (SDE windows: Flow-GRPO, -Fast, MixGRPO, DanceGRPO, CPS), ``tree`` (BranchGRPO's
branching trees), ``endpoints`` (clean ODE samples, optionally of a lagged copy: RAM, GDRO,
DiffusionNFT), ``tokens`` (autoregressive completions) and ``masked`` (masked-diffusion
unmasking); ``flow`` holds the flow rollouts' shared sampling and decoding helpers.
"""

from genrl.rollouts.base import OutputFn, Rollout

__all__ = ["OutputFn", "Rollout"]
