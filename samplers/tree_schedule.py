"""Where BranchGRPO's trees split (``samplers/tree.py`` samples them), without torch at import.

A config's split steps and branching factors are checked against this schedule before the
command line imports torch, so a tree that cannot be built answers at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TreeSchedule:
    """Where the trees split.

    Attributes:
        num_steps: sampling steps ``T``.
        split_steps: step indices at which every node splits (strictly increasing, in
            ``[0, T)``).
        branching: children per node at each split step (each >= 1).
        ode_steps: steps taken deterministically (BranchGRPO-Mix); they cannot be split steps.
    """

    num_steps: int
    split_steps: tuple[int, ...]
    branching: tuple[int, ...]
    ode_steps: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if len(self.split_steps) != len(self.branching):
            raise ValueError(
                f"one branching factor per split step: {len(self.split_steps)} split steps, "
                f"{len(self.branching)} factors"
            )
        if list(self.split_steps) != sorted(set(self.split_steps)) or any(
            not 0 <= s < self.num_steps for s in self.split_steps
        ):
            raise ValueError(
                f"split_steps must be strictly increasing steps in [0, {self.num_steps}), "
                f"got {list(self.split_steps)}"
            )
        if any(b < 1 for b in self.branching):
            raise ValueError(f"branching factors must be >= 1, got {list(self.branching)}")
        if any(not 0 <= s < self.num_steps for s in self.ode_steps):
            raise ValueError(f"ode_steps must lie in [0, {self.num_steps}), got {self.ode_steps}")
        if set(self.ode_steps) & set(self.split_steps):
            raise ValueError("a split step must be stochastic: it cannot be an ODE step")

    def factor(self, step: int) -> int:
        """Children per node at ``step`` (1 when it does not split)."""
        if step in self.split_steps:
            return self.branching[self.split_steps.index(step)]
        return 1

    def width(self, step: int) -> int:
        """Nodes per tree entering ``step`` (``width(T)``: the leaves)."""
        return math.prod(self.factor(s) for s in range(step))

    def edges(self, step: int) -> int:
        """Edges per tree taken at ``step`` (= ``width(step + 1)``)."""
        return self.width(step + 1)

    @property
    def num_leaves(self) -> int:
        return self.width(self.num_steps)

    @property
    def edges_per_tree(self) -> int:
        return sum(self.edges(t) for t in range(self.num_steps))

    def parents(self, step: int, num_trees: int) -> torch.Tensor:
        """``[num_trees * edges(step)]``: the node (index among the step's ``num_trees *
        width(step)`` states) each edge starts from."""
        import torch  # here, so that a config's tree is checked without torch

        return torch.arange(num_trees * self.width(step)).repeat_interleave(self.factor(step))
