"""Algorithms: one file each, registered by name (``genrl list`` shows them)."""

from genrl.algorithms import (
    awm,
    branch_grpo,
    ddim_grpo,
    ddpo,
    dgpo,
    diffusion_nft,
    exgrpo,
    flow_grpo,
    gdro,
    grpo,
    marble,
    mask_grpo,
    ram,
)
from genrl.algorithms.base import ALGORITHMS, Algorithm, AlgorithmConfig, register_algorithm

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmConfig",
    "awm",
    "branch_grpo",
    "ddim_grpo",
    "ddpo",
    "dgpo",
    "diffusion_nft",
    "exgrpo",
    "flow_grpo",
    "gdro",
    "grpo",
    "marble",
    "mask_grpo",
    "ram",
    "register_algorithm",
]
