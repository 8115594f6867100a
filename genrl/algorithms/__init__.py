"""Algorithms: one file each, registered by name (``genrl list`` shows them)."""

from genrl.algorithms import diffu_grpo, flow_grpo, grpo, mask_grpo
from genrl.algorithms.base import ALGORITHMS, Algorithm, AlgorithmConfig, register_algorithm

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmConfig",
    "diffu_grpo",
    "flow_grpo",
    "grpo",
    "mask_grpo",
    "register_algorithm",
]
