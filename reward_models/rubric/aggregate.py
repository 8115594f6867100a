"""Aggregation of rubric criterion scores into one reward: weighted means, pitfalls, the
essential gate and per-group saturation.

Sources and what is this project's choice: RLR^3 (Yu et al. 2026, "Reinforcement Learning with
Robust Rubric Rewards", https://arxiv.org/abs/2605.30244) says in its abstract that it "employs
hierarchical aggregation to prioritize essential criteria over additional criteria, and
mitigates score saturation within rollout groups"; its formulas were not available to us (no
full text or code found), so the rules below are ours, chosen to be simple and hand-checkable:

* ``E`` = weighted mean of the essential criteria, ``A`` = weighted mean of the important and
  optional ones, ``P`` = sum of ``weight * score`` of the pitfalls divided by the positive
  criteria's weight sum (the pitfalls' own sum when there are no positive criteria);
* ``gate_pass`` = every essential criterion scores at least ``pass_threshold``;
* ``gate="hierarchical"`` (default): ``r = (E + gate_pass * A) / 2 - P`` (``E - P`` or
  ``A - P`` when the other part is absent), so with ``A >= 0`` and no pitfalls every response
  that passes the gate (``r >= 1/2``) outranks every one that fails it (``r = E/2 < 1/2``);
  ``gate="hard"``: ``r = gate_pass * F - P`` with ``F`` the weighted mean of all positive
  criteria; ``gate="none"``: ``r = F - P``.
* Saturation (``saturation="drop"``): a non-essential criterion whose score is the same for
  every sample of a group carries no within-group contrast, and is left out of that group's
  weighted means (essential criteria always stay: they gate). With group-normalised advantages
  (GRPO's ``(r - mean) / std``) a constant criterion only rescales the group's rewards, so this
  matters for unscaled advantages (Dr. GRPO), for gating, and inside a composite with other
  rewards. POW3R (https://arxiv.org/abs/2605.20164, abstract) makes the same observation about
  criteria that "all sampled rollouts pass or fail" (``reward_models/rubric/pow3r.py``).

Shapes: ``B`` samples, ``K`` criterion slots (the largest rubric in the batch; slots a sample's
rubric lacks have weight 0 and are inactive).
"""

from __future__ import annotations

import torch

CATEGORY_CODES = {"essential": 0, "important": 1, "optional": 2, "pitfall": 3}
GATES = ("hierarchical", "hard", "none")


def _wmean(scores: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` weighted mean over the masked slots (NaN where none is masked in)."""
    w = torch.where(mask, weights, torch.zeros_like(weights))
    total = w.sum(dim=1)
    value = (w * torch.nan_to_num(scores)).sum(dim=1) / total.clamp(min=1e-12)
    return torch.where(total > 0, value, torch.full_like(value, float("nan")))


def saturated(scores: torch.Tensor, groups: list[int], tol: float = 1e-6) -> torch.Tensor:
    """``[B, K]`` bool: the slot's score is finite and the same (within ``tol``) for every sample
    of the sample's group, and the group has at least two samples."""
    out = torch.zeros_like(scores, dtype=torch.bool)
    index = torch.tensor(groups)
    for g in set(groups):
        rows = (index == g).nonzero().flatten()
        if len(rows) < 2:
            continue
        block = scores[rows]
        finite = torch.isfinite(block).all(dim=0)
        spread = torch.nan_to_num(block.amax(dim=0) - block.amin(dim=0), nan=float("inf"))
        out[rows] = (finite & (spread <= tol)).expand(len(rows), -1)
    return out


def aggregate(
    scores: torch.Tensor,
    weights: torch.Tensor,
    categories: torch.Tensor,
    active: torch.Tensor,
    gate: str = "hierarchical",
    pass_threshold: float = 0.5,
) -> dict[str, torch.Tensor]:
    """The reward and its parts.

    Args:
        scores: ``[B, K]`` criterion scores in ``[0, 1]`` (NaN: not applicable).
        weights: ``[B, K]`` non-negative weights (0 for empty slots).
        categories: ``[B, K]`` ``CATEGORY_CODES`` values.
        active: ``[B, K]`` bool, slots that count (applicable, present, not dropped).
        gate: ``"hierarchical"``, ``"hard"`` or ``"none"`` (module docstring).
        pass_threshold: an essential criterion passes at this score or above.

    Returns: ``[B]`` tensors ``reward`` (NaN where no criterion is active), ``essential``
    (``E``), ``additional`` (``A``), ``pitfall_penalty`` (``P``) and ``gate_pass`` (0/1).
    """
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    active = active & torch.isfinite(scores) & (weights > 0)
    essential = active & (categories == 0)
    additional = active & ((categories == 1) | (categories == 2))
    positive, pitfall = essential | additional, active & (categories == 3)
    e = _wmean(scores, weights, essential)
    a = _wmean(scores, weights, additional)
    f = _wmean(scores, weights, positive)
    w_pos = torch.where(positive, weights, torch.zeros_like(weights)).sum(dim=1)
    w_pit = torch.where(pitfall, weights, torch.zeros_like(weights))
    p_sum = (w_pit * torch.nan_to_num(scores)).sum(dim=1)
    denominator = torch.where(w_pos > 0, w_pos, w_pit.sum(dim=1)).clamp(min=1e-12)
    p = p_sum / denominator
    failed = essential & (torch.nan_to_num(scores, nan=0.0) < pass_threshold)
    gate_pass = (~failed.any(dim=1)).float()
    if gate == "hierarchical":
        both = (e + gate_pass * a) / 2
        r = torch.where(e.isnan(), a, torch.where(a.isnan(), e, both))
    elif gate == "hard":
        r = gate_pass * f
    else:
        r = f
    r = torch.nan_to_num(r, nan=0.0) - p
    none_active = ~active.any(dim=1)
    r = torch.where(none_active, torch.full_like(r, float("nan")), r)
    return {
        "reward": r,
        "essential": e,
        "additional": a,
        "pitfall_penalty": p,
        "gate_pass": gate_pass,
    }


__all__ = ["CATEGORY_CODES", "GATES", "aggregate", "saturated"]
