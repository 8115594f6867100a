"""Which edges of BranchGRPO's trees are trained (pruning changes training, never the rollout).

Depth pruning leaves whole depths out; width pruning keeps some edges of a depth. The reference
code (Fredreic1849/BranchGRPO, ``fastvideo/train_branchgrpo_flux.py``, ``train_one_step_tree``)
indexes depths by the depth of an edge's child (the edges of sampling step ``t`` enter depth
``t + 1``) and applies width pruning to the transitions after the last split only:

* ``last_split_top`` (its ``--width_pruning_mode 1``): the transitions below each branch made by
  the last split form a group; each keeps its top ``max(1, int(n * ratio))`` by signed advantage
  (ties: earlier steps first, the order the reference collects them in);
* ``last_split_best_worst`` (mode 2): all such transitions of the process are sorted by signed
  advantage and ``k = max(2, int(n * ratio))`` are kept, the best ``k // 2`` and the worst rest.

Two modes of genrl's own act on other steps:

* ``sibling_top``: at split steps each sibling group keeps its top ``ceil(ratio * factor)`` edges
  by ``|A|``;
* ``best_worst_paths``: at every trained step, the edges on the paths to each tree's best and
  worst leaf (an edge on both paths counts twice, so that every tree trains the same number).

All functions work on the ``[R, E_t]`` edge advantages of one process's ``R`` trees and return
flat edge indices (``tree * E_t + edge``) per trained step.
"""

from __future__ import annotations

import math

import torch

from genrl.objectives.flow_configs import WIDTH_PRUNING, WidthPruning, pruned_depths
from samplers.tree_schedule import TreeSchedule


def kept_edges(
    schedule: TreeSchedule,
    steps: list[int],
    advantages: dict[int, torch.Tensor],
    mode: WidthPruning,
    ratio: float,
) -> dict[int, torch.Tensor]:
    """Flat indices of the trained edges of each step in ``steps`` (sorted).

    Args:
        schedule: the trees' schedule.
        steps: the trained steps (after depth pruning), ascending.
        advantages: step -> ``[R, E_t]`` edge advantages.
        mode, ratio: the width pruning and its ratio.
    """
    if mode == "none":
        return {t: torch.arange(advantages[t].numel()) for t in steps}
    if mode == "sibling_top":
        return {t: _sibling_top(advantages[t], schedule.factor(t), ratio) for t in steps}
    if mode == "best_worst_paths":
        leaf_values = advantages_at_leaves(schedule, steps, advantages)
        return {t: _on_extreme_paths(leaf_values, schedule, t) for t in steps}
    last = max(schedule.split_steps)
    pre = [t for t in steps if t <= last]
    post = [t for t in steps if t > last]
    out = {t: torch.arange(advantages[t].numel()) for t in pre}
    if not post:
        return out
    # [R, chains, K]: after the last split every step has one edge per chain.
    stacked = torch.stack([advantages[t] for t in post], dim=-1)
    if mode == "last_split_top":
        keep = _chain_top(stacked, ratio)
    elif mode == "last_split_best_worst":
        keep = _best_and_worst(stacked, ratio)
    else:
        raise ValueError(f"width pruning must be one of {WIDTH_PRUNING}, got {mode!r}")
    for k, t in enumerate(post):
        out[t] = keep[..., k].flatten().nonzero()[:, 0]
    return out


def num_kept_edges(
    schedule: TreeSchedule, steps: list[int], num_trees: int, mode: WidthPruning, ratio: float
) -> int:
    """How many edge indices ``kept_edges`` returns for ``num_trees`` trees (plans the LR
    schedule before any rollout)."""
    if mode == "none":
        return num_trees * sum(schedule.edges(t) for t in steps)
    if mode == "sibling_top":
        total = 0
        for t in steps:
            e, f = schedule.edges(t), schedule.factor(t)
            total += e if f == 1 else e // f * math.ceil(ratio * f)
        return num_trees * total
    if mode == "best_worst_paths":
        return num_trees * 2 * len(steps)
    last = max(schedule.split_steps)
    pre = sum(schedule.edges(t) for t in steps if t <= last)
    post = [t for t in steps if t > last]
    chains = schedule.edges(last)
    if not post:
        return num_trees * pre
    if mode == "last_split_top":
        return num_trees * (pre + chains * max(1, int(len(post) * ratio)))
    return num_trees * pre + max(2, int(num_trees * chains * len(post) * ratio))


def advantages_at_leaves(
    schedule: TreeSchedule, steps: list[int], advantages: dict[int, torch.Tensor]
) -> torch.Tensor:
    """``[R, L]`` leaf-depth advantages (the edges of the last step), for picking extreme paths."""
    last = schedule.num_steps - 1
    if last in advantages:
        return advantages[last]
    raise ValueError("best_worst_paths needs the last step's edge advantages")


def _sibling_top(advantage: torch.Tensor, factor: int, ratio: float) -> torch.Tensor:
    if factor == 1:
        return torch.arange(advantage.numel())
    num_trees, edges = advantage.shape
    groups = advantage.abs().view(num_trees, edges // factor, factor)
    top = groups.topk(math.ceil(ratio * factor), dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, top, True)
    return mask.flatten().nonzero()[:, 0]


def _on_extreme_paths(leaf_values: torch.Tensor, schedule: TreeSchedule, step: int) -> torch.Tensor:
    """The edges of ``step`` on the paths to each tree's best and worst leaf (2 per tree)."""
    num_trees, num_leaves = leaf_values.shape
    edges = schedule.edges(step)
    extremes = torch.stack([leaf_values.argmax(1), leaf_values.argmin(1)], dim=1)  # [R, 2]
    on_path = extremes // (num_leaves // edges)
    return (on_path + torch.arange(num_trees)[:, None] * edges).flatten()


def _chain_top(stacked: torch.Tensor, ratio: float) -> torch.Tensor:
    """``[R, C, K]`` mask: each chain's top ``max(1, int(K * ratio))`` by signed advantage,
    earlier steps first among equals."""
    k = stacked.shape[-1]
    keep = max(1, int(k * ratio))
    order = torch.sort(stacked, dim=-1, descending=True, stable=True).indices[..., :keep]
    return torch.zeros_like(stacked, dtype=torch.bool).scatter_(-1, order, True)


def _best_and_worst(stacked: torch.Tensor, ratio: float) -> torch.Tensor:
    """``[R, C, K]`` mask over all of the process's post-split transitions, ordered tree by tree,
    chain by chain, step by step (the reference's collection order): the best ``keep // 2`` and
    the worst ``keep - keep // 2`` by signed advantage."""
    flat = stacked.flatten()
    keep = max(2, int(flat.numel() * ratio))
    best = keep // 2
    order = torch.sort(flat, descending=True, stable=True).indices
    chosen = torch.cat([order[:best], order[len(order) - (keep - best) :]])
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask[chosen] = True
    return mask.view_as(stacked)


__all__ = ["WIDTH_PRUNING", "WidthPruning", "kept_edges", "num_kept_edges", "pruned_depths"]
