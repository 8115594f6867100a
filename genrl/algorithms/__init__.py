"""Algorithms: one file each, registered by name (``genrl list`` shows them)."""

from genrl.algorithms import flow_grpo, grpo
from genrl.algorithms.base import ALGORITHMS, Algorithm, AlgorithmConfig, register_algorithm

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "flow_grpo", "grpo", "register_algorithm"]
