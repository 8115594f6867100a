"""BranchGRPO's advantages (Li et al. 2025, "BranchGRPO", sec. 3.2-3.3): leaf rewards fused up
each tree, then z-scored depth by depth within the tree.

Layout (``samplers/tree.py``): a tree of ``T`` steps has ``width(d) = prod(factors[:d])`` nodes at
depth ``d`` (depth ``d`` is entered by the edges of step ``d - 1``; the root is depth 0 and the
``L = width(T)`` leaves are depth ``T``); the children of a node are consecutive, so the leaves
below any node form one contiguous block. Everything is pure tensor math on ``[R, ...]`` tensors of
``R`` trees and is computed in float64.

Conventions of the reference code (``fastvideo/train_branchgrpo_flux.py`` of
Fredreic1849/BranchGRPO, ``compute_node_rewards_from_leaves`` and
``compute_hierarchical_advantages_by_depth``), which are the defaults here:

* the leaf values are the raw rewards (not group-normalised ones);
* an internal node's value is the mean of its leaves, or with probability fusion the softmax over
  its children's own edge log-probs of the children's values, level by level (a node with one
  child passes its child's value up);
* at each depth the nodes of a tree are z-scored with the sample std (``torch.std``) plus 1e-8,
  and a depth whose std is below 1e-6 (or that has one node) gets advantage 0.

The advantage of an edge is the advantage of the node it enters. Because rewards are not
normalised first, a tree whose rewards are equal up to float noise gets advantages of exactly 0;
the advantages are unchanged by an affine map ``a r + b`` (``a > 0``) of the rewards only as long
as every depth's std stays above ``min_std`` and well above ``eps``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from genrl.objectives.flow_configs import FUSIONS, Fusion


def _widths(factors: list[int]) -> list[int]:
    """``width(d)`` for ``d = 0..T``."""
    return [math.prod(factors[:d]) for d in range(len(factors) + 1)]


def node_values(
    leaf_rewards: torch.Tensor,
    factors: list[int],
    fusion: Fusion = "mean",
    edge_log_probs: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """The value of every node of every tree, depth by depth.

    * ``mean``: a node's value is the mean reward of its leaves;
    * ``probability`` (the reference's ``--tree_prob_weighted``): at a node with several
      children, ``sum_c softmax_c(log p(edge to c)) value(c)``, level by level;
    * ``path_probability``: the mean of the node's leaves weighted by
      ``softmax_l(sum of the edge log-probs on the path from the node down to leaf l)``, every
      step below counted (an earlier genrl variant, kept for comparison).

    Args:
        leaf_rewards: ``[R, L]`` rewards of each tree's leaves.
        factors: ``T`` children per node at each step (1 where a step does not split).
        fusion: see above.
        edge_log_probs: ``T`` tensors ``[R, width(t + 1)]``, each edge's log-prob (needed by the
            probability fusions).

    Returns:
        ``T + 1`` float64 tensors ``[R, width(d)]`` (``[0]``: the roots, ``[T]``: the leaves).
    """
    if fusion not in FUSIONS:
        raise ValueError(f"fusion must be one of {FUSIONS}, got {fusion!r}")
    widths = _widths(factors)
    rewards = leaf_rewards.double()
    num_trees, num_leaves = rewards.shape
    if num_leaves != widths[-1]:
        raise ValueError(
            f"{num_leaves} leaves per tree, but the factors {factors} make {widths[-1]}"
        )
    if fusion != "mean" and (edge_log_probs is None or len(edge_log_probs) != len(factors)):
        raise ValueError(f"fusion={fusion!r} needs one edge log-prob tensor per step")
    values = [rewards]
    if fusion == "path_probability":
        assert edge_log_probs is not None
        # below[r, l]: log-prob of leaf l's path from the current depth down to it.
        below = torch.zeros_like(rewards)
        for d in range(len(factors) - 1, -1, -1):
            per_leaf = edge_log_probs[d].double().repeat_interleave(num_leaves // widths[d + 1], 1)
            below = below + per_leaf
            logits = below.view(num_trees, widths[d], -1)
            weights = torch.softmax(logits, dim=-1)
            values.insert(0, (weights * rewards.view(num_trees, widths[d], -1)).sum(-1))
        return values
    for d in range(len(factors) - 1, -1, -1):
        children = values[0].view(num_trees, widths[d], factors[d])
        if fusion == "mean" or factors[d] == 1:
            # Equal-sized subtrees: the mean of the children's means is the mean of the leaves.
            values.insert(0, children.mean(-1))
            continue
        assert edge_log_probs is not None
        logits = edge_log_probs[d].double().view(num_trees, widths[d], factors[d])
        values.insert(0, (torch.softmax(logits, dim=-1) * children).sum(-1))
    return values


def depthwise_advantages(
    values: list[torch.Tensor],
    *,
    eps: float = 1e-8,
    min_std: float = 1e-6,
    std_estimator: Literal["sample", "population"] = "sample",
) -> list[torch.Tensor]:
    """Each depth's node values z-scored within each tree (BranchGRPO eq. 6):
    ``A = (v - mean_depth) / (std_depth + eps)``, exactly 0 where the depth has one node per tree
    or its std is below ``min_std`` (no preference between branches).

    Args:
        values: ``node_values``'s output, ``[R, width(d)]`` per depth.
        eps, min_std, std_estimator: the reference's 1e-8, 1e-6 and ``torch.std`` (sample).

    Returns:
        float32 ``[R, width(d)]`` per depth (depth 0, the roots, is always 0).
    """
    if std_estimator not in ("sample", "population"):
        raise ValueError(f"std_estimator must be sample or population, got {std_estimator!r}")
    out = []
    for v in values:
        v = v.double()
        if v.shape[1] < 2:
            out.append(torch.zeros_like(v, dtype=torch.float32))
            continue
        std = v.std(dim=1, unbiased=std_estimator == "sample", keepdim=True)
        centred = v - v.mean(dim=1, keepdim=True)
        a = torch.where(std >= min_std, centred / (std + eps), torch.zeros_like(centred))
        out.append(a.float())
    return out


def edge_advantages_per_leaf(depth_advantages: list[torch.Tensor]) -> torch.Tensor:
    """``[R * L, T]``: for leaf ``l`` and step ``t``, the advantage of the edge of step ``t`` on
    the path to ``l`` (the advantage of depth ``t + 1``), so that a tree's advantages travel
    with its leaves like per-step advantages of independent trajectories."""
    num_leaves = depth_advantages[-1].shape[1]
    columns = [
        a.repeat_interleave(num_leaves // a.shape[1], dim=1).reshape(-1)
        for a in depth_advantages[1:]
    ]
    return torch.stack(columns, dim=1)


def per_leaf(edge_tensors: list[torch.Tensor], num_trees: int) -> torch.Tensor:
    """``[R * L, T]`` from ``T`` per-edge tensors ``[R * width(t + 1)]`` (e.g. the edges'
    log-probs): entry ``(l, t)`` belongs to the edge of step ``t`` on the path to leaf ``l``."""
    num_leaves = edge_tensors[-1].numel() // num_trees
    columns = [
        e.view(num_trees, -1).repeat_interleave(num_leaves // (e.numel() // num_trees), 1)
        for e in edge_tensors
    ]
    return torch.stack([c.reshape(-1) for c in columns], dim=1)


def from_leaves(per_leaf_values: torch.Tensor, edges: int, num_trees: int) -> torch.Tensor:
    """``[R * edges]`` per-edge values of one step from its column of a ``[R * L]`` per-leaf
    tensor (every leaf below an edge holds the edge's value; the first one is read)."""
    num_leaves = per_leaf_values.numel() // num_trees
    return per_leaf_values.view(num_trees, edges, num_leaves // edges)[:, :, 0].reshape(-1)


__all__ = [
    "FUSIONS",
    "Fusion",
    "depthwise_advantages",
    "edge_advantages_per_leaf",
    "from_leaves",
    "node_values",
    "per_leaf",
]
