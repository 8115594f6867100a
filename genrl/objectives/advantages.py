"""Advantage estimators: turn rewards (plus group bookkeeping) into per-sample advantages.

Every function here is pure tensor math on the *gathered* batch (all processes), so that a run on
N processes computes exactly what a run on one process computes. BranchGRPO's tree estimators
live in ``genrl/objectives/tree_advantages.py``.

The group std comes in both estimators the references use (``std_estimator``): ``population``
(divide by ``n``; Flow-GRPO's ``np.std``) and ``sample`` (Bessel, divide by ``n - 1``; TRL's and
verl's ``torch.std``). A group of one sample has no baseline: with the population estimator its
advantage is exactly 0 (as in Flow-GRPO), the sample estimator is undefined there and refuses it
(verl keeps the raw score instead, which silently trains such samples on an unbaselined reward).
"""

from __future__ import annotations

from collections import deque
from typing import Literal

import torch

from genrl.objectives.flow_configs import validate_median_groups as validate_median_groups

StdMode = Literal["group", "global", "none"]
STD_MODES: tuple[str, ...] = ("group", "global", "none")
StdEstimator = Literal["sample", "population"]
STD_ESTIMATORS: tuple[str, ...] = ("sample", "population")


def _check_std_mode(std_mode: str) -> None:
    if std_mode not in STD_MODES:
        raise ValueError(f"std_mode must be one of {STD_MODES}, got {std_mode!r}")


def _check_std_estimator(std_estimator: str) -> None:
    if std_estimator not in STD_ESTIMATORS:
        raise ValueError(f"std_estimator must be one of {STD_ESTIMATORS}, got {std_estimator!r}")


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    std_mode: StdMode = "group",
    eps: float = 1e-4,
    std_estimator: StdEstimator = "population",
) -> torch.Tensor:
    """Group z-score of GRPO (Shao et al. 2024, eq. 3).

    ``A_i = (r_i - mean_{g(i)}) / (std + eps)`` where ``mean_{g(i)}`` is the mean reward of sample
    ``i``'s group and ``std`` is the standard deviation (``std_estimator``) of that group
    (``"group"``), of the whole batch (``"global"``, Flow-GRPO's ``global_std``, TRL's
    ``scale_rewards="batch"``), or 1 (``"none"``, Dr.GRPO).

    Args:
        rewards: ``[N]`` float rewards, or ``[N, T]`` (one reward per step, e.g. Flow-GRPO's
            ``kl_reward``): every column is normalised on its own.
        group_ids: ``[N]`` integer ids; samples with the same id form one group.
        std_mode: which standard deviation divides the centred reward.
        eps: added to the std so that zero-variance groups give advantage 0, not NaN.
        std_estimator: ``population`` or ``sample`` (Bessel).

    Returns:
        float32 advantages of ``rewards``' shape.
    """
    _check_std_mode(std_mode)
    _check_std_estimator(std_estimator)
    rewards = rewards.float()
    if rewards.ndim not in (1, 2) or rewards.shape[0] != group_ids.shape[0] or group_ids.ndim != 1:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} must be [N] or [N, T] and group_ids "
            f"{tuple(group_ids.shape)} [N]"
        )
    unbiased = std_estimator == "sample"
    means, group_std, inverse = group_moments(rewards, group_ids, unbiased=unbiased)
    centred = rewards - means[inverse]
    if std_mode == "none":
        return centred
    if std_mode == "global":
        std = rewards.std(dim=0, unbiased=unbiased and rewards.shape[0] > 1)
        return _divide(centred, std + eps)
    if unbiased:
        _refuse_singletons(group_ids)
    return _divide(centred, group_std[inverse] + eps)


def _divide(centred: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``centred / scale``, and 0 where the scale is 0 (a flat group with ``eps = 0``, whose
    centred rewards are exactly 0)."""
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.where(scale > 0, centred / safe, torch.zeros_like(centred))


def _refuse_singletons(group_ids: torch.Tensor) -> None:
    _, counts = torch.unique(group_ids, return_counts=True)
    if bool((counts < 2).any()):
        raise ValueError(
            "a group holds a single sample: the sample std of one value is undefined and the "
            "sample has no baseline (train with group_size >= 2)"
        )


def group_moments(
    values: torch.Tensor, group_ids: torch.Tensor, *, unbiased: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group mean and std of ``values`` ``[N]`` or ``[N, T]`` (per column), without a
    Python loop. ``unbiased`` divides the squared deviations by ``n - 1`` (a group of one then
    gets std 0).

    Returns:
        ``means [G, ...]``, ``stds [G, ...]`` and ``inverse [N]`` (each sample's group index).
    """
    values = values.float()
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    counts = counts.to(values.device, values.dtype).view(-1, *([1] * (values.ndim - 1)))
    inverse = inverse.to(values.device)
    zeros = torch.zeros((len(counts), *values.shape[1:]), dtype=values.dtype, device=values.device)
    means = zeros.index_add(0, inverse, values) / counts
    squares = zeros.index_add(0, inverse, (values - means[inverse]).square())
    divisor = (counts - 1).clamp(min=1) if unbiased else counts
    return means, (squares / divisor).sqrt(), inverse


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
        eps: added to the std (Flow-GRPO: 1e-4).
        std_estimator: ``population`` (Flow-GRPO's ``np.std``) or ``sample``.
    """

    def __init__(
        self,
        std_mode: StdMode = "group",
        history: int = 1,
        eps: float = 1e-4,
        std_estimator: StdEstimator = "population",
    ) -> None:
        _check_std_mode(std_mode)
        _check_std_estimator(std_estimator)
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        self.std_mode: StdMode = std_mode
        self.history = history
        self.eps = eps
        self.std_estimator: StdEstimator = std_estimator
        self._past: dict[str, deque[list[float]]] = {}

    def update(self, prompts: list[str], rewards: torch.Tensor) -> torch.Tensor:
        """Advantages for the gathered batch (``[N]``, or ``[N, T]`` with one reward per step,
        each column normalised on its own), then remember its rewards."""
        rewards = rewards.float()
        if len(prompts) != rewards.shape[0]:
            raise ValueError(f"{len(prompts)} prompts but {rewards.shape[0]} rewards")
        if rewards.ndim != 1 and self.history > 1:
            raise ValueError("per-step rewards [N, T] cannot be pooled over iterations (history)")
        index: dict[str, int] = {}
        ids = torch.tensor([index.setdefault(p, len(index)) for p in prompts], dtype=torch.long)
        if self.history == 1:
            return group_advantages(
                rewards,
                ids,
                std_mode=self.std_mode,
                eps=self.eps,
                std_estimator=self.std_estimator,
            )
        advantages = self._with_history(rewards, ids, index)
        for prompt, gid in index.items():
            past = self._past.setdefault(prompt, deque(maxlen=self.history - 1))
            past.append(rewards[ids == gid].tolist())
        return advantages

    def _with_history(
        self, rewards: torch.Tensor, ids: torch.Tensor, index: dict[str, int]
    ) -> torch.Tensor:
        unbiased = self.std_estimator == "sample"
        means = torch.empty(len(index))
        stds = torch.empty(len(index))
        for prompt, gid in index.items():
            pooled = [r for past in self._past.get(prompt, ()) for r in past]
            pooled_t = torch.cat([torch.tensor(pooled, dtype=torch.float32), rewards[ids == gid]])
            if unbiased and len(pooled_t) < 2:
                _refuse_singletons(torch.zeros(1))
            means[gid] = pooled_t.mean()
            stds[gid] = pooled_t.std(unbiased=unbiased)
        centred = rewards - means[ids]
        if self.std_mode == "none":
            return centred
        if self.std_mode == "global":
            return centred / (rewards.std(unbiased=unbiased) + self.eps)
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


def median_centered_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-3
) -> tuple[torch.Tensor, torch.Tensor]:
    """MC-GRPO's advantages (Kim 2026, "Median-Centered Group Relative Policy Optimization for
    Small-Rollout Reinforcement Learning", arXiv 2601.22582), as its released trainer computes
    them: each group of ``G + 1`` samples is centred on its median and scaled by its median
    absolute deviation,

        A_i = (r_i - med_g) / (median_g |r - med_g| + eps),

    then the non-zero advantages of a group (``|A| > 1e-6``) are multiplied by
    ``group size / their number``, and one sample per group at the median (the pivot, advantage
    0) is left out of training, so ``G`` samples per prompt carry gradient.

    The median of a group of ``n`` is its ``(n - 1) // 2``-th smallest value (``torch.median``;
    an odd ``n`` makes it a sample's own reward); among tied samples the pivot is the first.

    Args:
        rewards, group_ids: ``[N]``.
        eps: added to the MAD (the reference: 1e-3).

    Returns:
        ``[N]`` float32 advantages and ``[N]`` bool pivots (True: left out of training).
    """
    rewards = rewards.float()
    if rewards.shape != group_ids.shape or rewards.ndim != 1:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must both be [N]"
        )
    advantages = torch.zeros_like(rewards)
    pivots = torch.zeros_like(rewards, dtype=torch.bool)
    for group in torch.unique(group_ids):
        members = (group_ids == group).nonzero()[:, 0]
        r = rewards[members]
        median = r.median()
        deviation = (r - median).abs().median()
        a = (r - median) / (deviation + eps)
        nonzero = ~torch.isclose(a, torch.zeros_like(a), atol=1e-6)
        if nonzero.any():
            a = torch.where(nonzero, a * (len(r) / int(nonzero.sum())), a)
        advantages[members] = a
        pivots[members[int((r == median).nonzero()[0, 0])]] = True
    return advantages, pivots


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
    estimator: Literal["group", "rloo", "median"],
    std_mode: StdMode = "group",
    max_abs: float | None = None,
    *,
    eps: float = 1e-4,
    std_estimator: StdEstimator = "sample",
) -> torch.Tensor:
    """The GRPO family's per-sequence advantages: group z-score (``std_mode``, ``eps``,
    ``std_estimator``), leave-one-out, or MC-GRPO's median-centred ones (``eps`` on the MAD;
    their pivots come from ``median_centered_advantages``), then clipped to ``+-max_abs``."""
    if estimator == "median":
        advantages, _ = median_centered_advantages(rewards, group_ids, eps)
    elif estimator == "rloo":
        advantages = rloo_advantages(rewards, group_ids)
    elif estimator == "group":
        advantages = group_advantages(
            rewards, group_ids, std_mode=std_mode, eps=eps, std_estimator=std_estimator
        )
    else:
        raise ValueError(
            f"advantage estimator must be 'group', 'rloo' or 'median', got {estimator!r}"
        )
    return clip_advantages(advantages, max_abs)
