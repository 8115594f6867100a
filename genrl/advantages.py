"""Advantage estimators: turn rewards (plus group bookkeeping) into per-sample advantages.

Every function here is pure tensor math on the *gathered* batch (all processes), so that a run on
N processes computes exactly what a run on one process computes.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

import torch

StdMode = Literal["group", "global", "none"]
STD_MODES: tuple[str, ...] = ("group", "global", "none")


def _check_std_mode(std_mode: str) -> None:
    if std_mode not in STD_MODES:
        raise ValueError(f"std_mode must be one of {STD_MODES}, got {std_mode!r}")


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    std_mode: StdMode = "group",
    eps: float = 1e-4,
) -> torch.Tensor:
    """Group z-score of GRPO (Shao et al. 2024, eq. 3) as used by Flow-GRPO.

    ``A_i = (r_i - mean_{g(i)}) / (std + eps)`` where ``mean_{g(i)}`` is the mean reward of sample
    ``i``'s group and ``std`` is the population standard deviation of that group (``"group"``),
    of the whole batch (``"global"``, Flow-GRPO's ``global_std``), or 1 (``"none"``, Dr.GRPO).

    Args:
        rewards: ``[N]`` float rewards.
        group_ids: ``[N]`` integer ids; samples with the same id form one group.
        std_mode: which standard deviation divides the centred reward.
        eps: added to the std so that zero-variance groups give advantage 0, not NaN.

    Returns:
        ``[N]`` float32 advantages.
    """
    _check_std_mode(std_mode)
    rewards = rewards.float()
    if rewards.shape != group_ids.shape or rewards.ndim != 1:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must both be [N]"
        )
    means, group_std, inverse = group_moments(rewards, group_ids)
    centred = rewards - means[inverse]
    if std_mode == "none":
        return centred
    if std_mode == "global":
        std = rewards.std(unbiased=False)
        return centred / (std + eps)
    return centred / (group_std[inverse] + eps)


def group_moments(
    values: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group mean and population std of ``values`` ``[N]``, without a Python loop.

    Returns:
        ``means [G]``, ``stds [G]`` and ``inverse [N]`` (each sample's group index into them).
    """
    values = values.float()
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    zeros = torch.zeros(counts.numel(), dtype=values.dtype, device=values.device)
    means = zeros.index_add(0, inverse, values) / counts
    variances = zeros.index_add(0, inverse, (values - means[inverse]).square()) / counts
    return means, variances.sqrt(), inverse


def clip_advantages(advantages: torch.Tensor, max_abs: float | None) -> torch.Tensor:
    """Clamp advantages to ``[-max_abs, max_abs]`` (Flow-GRPO clips to 5); None disables."""
    if max_abs is None:
        return advantages
    if max_abs <= 0:
        raise ValueError(f"advantage clip must be positive, got {max_abs}")
    return advantages.clamp(-max_abs, max_abs)


def zero_std_fraction(rewards: torch.Tensor, group_ids: torch.Tensor, tol: float = 1e-6) -> float:
    """Fraction of groups whose rewards are all equal (they carry no learning signal)."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    num_groups = counts.numel()
    low = torch.full((num_groups,), float("inf"), device=rewards.device).scatter_reduce(
        0, inverse, rewards.float(), "amin"
    )
    high = torch.full((num_groups,), float("-inf"), device=rewards.device).scatter_reduce(
        0, inverse, rewards.float(), "amax"
    )
    return float(((high - low) <= tol).float().mean())


class PerPromptStatTracker:
    """Per-prompt reward statistics, Flow-GRPO style.

    Groups are keyed by the prompt *text*: two groups with the same prompt in one batch are pooled,
    and with ``history > 1`` the rewards of that prompt from the previous ``history - 1`` calls
    are pooled too (a running baseline for prompts that recur). ``history = 1`` recomputes stats
    from the current batch only, which is Flow-GRPO's behaviour (it clears the tracker every epoch).

    Args:
        std_mode: ``"group"`` (per-prompt std), ``"global"`` (std of the whole current batch) or
            ``"none"``.
        history: how many calls' rewards to pool per prompt (>= 1).
        eps: added to the std.
    """

    def __init__(self, std_mode: StdMode = "group", history: int = 1, eps: float = 1e-4) -> None:
        _check_std_mode(std_mode)
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        self.std_mode: StdMode = std_mode
        self.history = history
        self.eps = eps
        self._past: dict[str, deque[list[float]]] = {}

    def update(self, prompts: list[str], rewards: torch.Tensor) -> torch.Tensor:
        """Advantages ``[N]`` for the gathered batch, then remember its rewards."""
        rewards = rewards.float()
        if len(prompts) != rewards.numel():
            raise ValueError(f"{len(prompts)} prompts but {rewards.numel()} rewards")
        index: dict[str, int] = {}
        ids = torch.tensor([index.setdefault(p, len(index)) for p in prompts], dtype=torch.long)
        if self.history == 1:
            advantages = group_advantages(rewards, ids, std_mode=self.std_mode, eps=self.eps)
        else:
            advantages = self._with_history(prompts, rewards, ids, index)
        if self.history > 1:
            for prompt, gid in index.items():
                past = self._past.setdefault(prompt, deque(maxlen=self.history - 1))
                past.append(rewards[ids == gid].tolist())
        return advantages

    def _with_history(
        self, prompts: list[str], rewards: torch.Tensor, ids: torch.Tensor, index: dict[str, int]
    ) -> torch.Tensor:
        means = torch.empty(len(index))
        stds = torch.empty(len(index))
        for prompt, gid in index.items():
            pooled = [r for past in self._past.get(prompt, ()) for r in past]
            pooled_t = torch.cat([torch.tensor(pooled, dtype=torch.float32), rewards[ids == gid]])
            means[gid] = pooled_t.mean()
            stds[gid] = pooled_t.std(unbiased=False)
        centred = rewards - means[ids]
        if self.std_mode == "none":
            return centred
        if self.std_mode == "global":
            return centred / (rewards.std(unbiased=False) + self.eps)
        return centred / (stds[ids] + self.eps)

    def clear(self) -> None:
        self._past.clear()

    def state_dict(self) -> dict[str, object]:
        return {"past": {p: [list(r) for r in q] for p, q in self._past.items()}}

    def load_state_dict(self, state: dict[str, object]) -> None:
        past = state["past"]
        assert isinstance(past, dict)
        self._past = {
            p: deque([list(r) for r in q], maxlen=max(self.history - 1, 1)) for p, q in past.items()
        }


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024, eq. 6):
    ``A_i = r_i - mean_{j != i, g(j) = g(i)} r_j = G / (G - 1) * (r_i - mean_g)``.

    A group of one sample has no baseline and gets advantage 0.

    Args:
        rewards, group_ids: ``[N]``.

    Returns:
        ``[N]`` float32.
    """
    rewards = rewards.float()
    if rewards.shape != group_ids.shape or rewards.ndim != 1:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must both be [N]"
        )
    means, _, inverse = group_moments(rewards, group_ids)
    sizes = torch.bincount(inverse).to(rewards.dtype)[inverse]
    scale = torch.where(sizes > 1, sizes / (sizes - 1).clamp(min=1), torch.zeros_like(sizes))
    return scale * (rewards - means[inverse])


def decoupled_group_rewards(
    scores: dict[str, torch.Tensor],
    weights: dict[str, float],
    group_ids: torch.Tensor,
    eps: float = 1e-4,
) -> torch.Tensor:
    """GDPO's normalise-then-sum of several rewards (Liu et al. 2026, arXiv 2601.05242): each
    reward is z-scored within its group, the z-scores are summed with their weights, and the sum
    is normalised over the batch,

        s_i = sum_k w_k (r_ki - mean_g(i) r_k) / (std_g(i) r_k + eps),   A_i = (s_i - mean s) / (std s + eps),

    so that a reward with a small spread is not drowned by one with a large spread, and distinct
    reward combinations keep distinct values. A NaN score (the reward does not apply to that
    sample) contributes 0, and group statistics use the samples it applies to.

    Args:
        scores: reward name -> ``[N]`` scores of the gathered batch.
        weights: reward name -> weight (the names of ``scores`` that are summed).
        group_ids: ``[N]`` long.

    Returns:
        ``[N]`` float32 (population std, like ``group_advantages``).
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1 if len(inverse) else 0
    total = torch.zeros(len(group_ids), dtype=torch.float64)
    for name, weight in weights.items():
        values = scores[name].double().cpu()
        valid = torch.isfinite(values)
        filled = torch.where(valid, values, torch.zeros_like(values))
        count = torch.zeros(groups, dtype=torch.float64).index_add_(0, inverse, valid.double())
        mean = torch.zeros(groups, dtype=torch.float64).index_add_(0, inverse, filled)
        mean = mean / count.clamp(min=1)
        centred = torch.where(valid, filled - mean[inverse], torch.zeros_like(filled))
        var = torch.zeros(groups, dtype=torch.float64).index_add_(0, inverse, centred.square())
        std = (var / count.clamp(min=1)).sqrt()
        spread = std[inverse]
        # A group whose reward k is constant is centred to exact zeros; keep them (not 0/0).
        total += weight * torch.where(
            spread > 0, centred / (spread + eps), torch.zeros_like(centred)
        )
    spread = total.std(unbiased=False)
    total = (total - total.mean()) / (spread + eps) if spread > 0 else total - total.mean()
    return total.float().to(group_ids.device)


def sequence_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    estimator: Literal["group", "rloo"],
    std_mode: StdMode = "group",
    max_abs: float | None = None,
) -> torch.Tensor:
    """The GRPO family's per-sequence advantages: group z-score (``std_mode``) or leave-one-out,
    then clipped to ``+-max_abs``."""
    if estimator == "rloo":
        advantages = rloo_advantages(rewards, group_ids)
    elif estimator == "group":
        advantages = group_advantages(rewards, group_ids, std_mode=std_mode)
    else:
        raise ValueError(f"advantage estimator must be 'group' or 'rloo', got {estimator!r}")
    return clip_advantages(advantages, max_abs)


def tree_values(
    leaf_rewards: torch.Tensor,
    edges_per_step: list[int],
    path_log_probs: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """BranchGRPO's reward fusion: the value of every edge of a tree from its leaves' rewards.

    The leaves below an edge form a contiguous block (children are numbered consecutively), so an
    edge of step ``t`` owns ``L / edges_per_step[t]`` leaves. Its value is their mean, or with
    ``path_log_probs`` the probability-weighted mean ``sum_l softmax(log p(path to l)) r_l``,
    where ``log p`` sums the log-probs of the edges below this one on the way to ``l`` (computed
    with ``logsumexp``, stable for log-probs of any size).

    Args:
        leaf_rewards: ``[R, L]`` rewards of each tree's leaves.
        edges_per_step: ``T`` edge counts per tree (``L`` divisible by each).
        path_log_probs: ``T`` tensors ``[R, edges_per_step[t]]``, the edges' log-probs.

    Returns:
        ``T`` tensors ``[R, edges_per_step[t]]`` of edge values (float32).
    """
    rewards = leaf_rewards.double()
    num_trees, num_leaves = rewards.shape
    steps = len(edges_per_step)
    if any(num_leaves % e for e in edges_per_step):
        raise ValueError(f"{num_leaves} leaves do not split evenly into {edges_per_step} edges")
    if path_log_probs is None:
        return [
            rewards.view(num_trees, e, num_leaves // e).mean(-1).float() for e in edges_per_step
        ]
    # below[t][r, l]: log-prob of leaf l's path strictly after step t (0 after the last step).
    below = [torch.zeros(num_trees, num_leaves, dtype=torch.float64)] * steps
    running = torch.zeros(num_trees, num_leaves, dtype=torch.float64)
    for t in range(steps - 1, -1, -1):
        below[t] = running
        e = edges_per_step[t]
        per_leaf = path_log_probs[t].double().repeat_interleave(num_leaves // e, dim=1)
        running = running + per_leaf
    values = []
    for t, e in enumerate(edges_per_step):
        logits = below[t].view(num_trees, e, num_leaves // e)
        weights = torch.softmax(logits, dim=-1)
        values.append((weights * rewards.view(num_trees, e, -1)).sum(-1).float())
    return values


def depthwise_advantages(values: list[torch.Tensor], eps: float = 1e-4) -> list[torch.Tensor]:
    """BranchGRPO's depth-wise advantages: each step's edge values z-scored within each tree.

    ``A = (v - mean_depth) / (std_depth + eps)`` over the ``[R, E_t]`` edges of one tree at one
    step (population std). A step with one edge per tree (before the first split) or with equal
    values gets exactly 0: it carries no preference between branches.
    """
    advantages = []
    for v in values:
        v = v.double()
        if v.shape[1] < 2:
            advantages.append(torch.zeros_like(v, dtype=torch.float32))
            continue
        centred = v - v.mean(dim=1, keepdim=True)
        std = v.std(dim=1, unbiased=False, keepdim=True)
        a = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
        advantages.append(a.float())
    return advantages
