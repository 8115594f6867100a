"""Losses of the regression objectives for flow models (RAM, GDRO, DiffusionNFT).

Each is a small object whose ``__call__`` takes velocities at noised clean samples and returns
``(loss, metrics)``. Conventions (all three papers): ``x_t = (1 - t) x_0 + t eps``, velocity target
``u = eps - x_0``, ``x_0``-prediction from a velocity ``v``: ``x_t - t v``. "Mean over dims" is the
mean over every non-batch dimension of a sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from genrl.objectives.losses import Metrics


def per_sample_mean(x: torch.Tensor, batch_dims: int = 1) -> torch.Tensor:
    """Mean over every dimension after the first ``batch_dims``."""
    return x.flatten(batch_dims).mean(dim=-1)


@dataclass
class RAMLoss:
    """Reinforce Adjoint Matching (Bergmeister et al. 2026, arXiv 2605.10759, eq. 17).

    ``target = v_ref + w * (u - v_corr)``,   ``L = mean_units mean_dims (v - stopgrad(target))^2``

    with ``w`` the (scaled) advantage of the unit's clean sample and ``v_corr`` the velocity in
    the correction: the current ``v`` itself, detached (the paper's eq. 17) or the lagged copy
    that sampled the endpoints (the released code). With ``w = 0`` the target is ``v_ref``: the
    frozen reference is the KL anchor, and no separate KL term exists.

    An optional ``time_weights`` ``[U]`` multiplies each unit's squared error (e.g. the
    control-space weight of ``RAMConfig.time_weighting``).

    Shapes: ``velocity``, ``reference_velocity``, ``correction_velocity``, ``target_velocity``
    ``[U, *event]``; ``weights`` ``[U]``.
    """

    def __call__(
        self,
        velocity: torch.Tensor,
        reference_velocity: torch.Tensor,
        correction_velocity: torch.Tensor,
        target_velocity: torch.Tensor,
        weights: torch.Tensor,
        time_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Metrics]:
        w = weights.view(-1, *([1] * (velocity.dim() - 1)))
        with torch.no_grad():
            target = reference_velocity + w * (target_velocity - correction_velocity)
        per_unit = per_sample_mean((velocity - target) ** 2)
        if time_weights is not None:
            per_unit = per_unit * time_weights
        loss = per_unit.mean()
        with torch.no_grad():
            metrics = {
                "regression_loss": loss.detach(),
                "reference_distance": (
                    per_sample_mean((velocity - reference_velocity) ** 2).mean()
                ).detach(),
                "flow_matching_error": (
                    per_sample_mean((velocity - target_velocity) ** 2).mean()
                ).detach(),
                "weight_abs_mean": weights.abs().mean(),
            }
        return loss, metrics


@dataclass
class GroupRankingLoss:
    """GDRO's group loss (Wang et al. 2026, arXiv 2601.02036, eq. 5, 7-9).

    Implicit rewards at a noising shared by the group (eq. 5):
    ``s_i = -beta * (||u_i - v_i||^2 - ||u_i - v_ref,i||^2)`` (norm reduced by ``reduction``).
    With the group sorted by explicit reward ``r_1 >= .. >= r_k``, the Plackett-Luce loss with
    soft targets (eq. 7):
    ``L_rank = sum_{i=1}^{k-1} [logsumexp(s_i..s_k) - sum_{j>=i} q_i(j) s_j]``,
    ``q_i = softmax(r_i..r_k / tau)`` (``tau = 0``: its limit, equal weight on the best
    remaining members, one-hot without ties: plain Plackett-Luce), plus ``gamma`` times the
    flow-matching loss of the best sample (eq. 8-9; members tied for best share it).
    With ``k = 2`` and ``tau -> 0`` it is Diffusion-DPO's ``-log sigmoid(s_1 - s_2)``.

    Args:
        beta: implicit-reward scale (``T * beta_KL`` in the paper; 6 GenEval, 12 OCR).
        tau: temperature of the soft targets (paper: 0.05).
        gamma: weight of the best sample's flow-matching loss (1.0 GenEval, 0.5 OCR).
        reduction: ``mean`` or ``sum`` over dims in the squared norms (the paper does not say;
            ``beta``'s meaning depends on it).

    Shapes: velocities and targets ``[U, k, *event]``; ``rewards`` ``[U, k]`` (any shift).
    """

    beta: float
    tau: float
    gamma: float
    reduction: str = "mean"

    def __call__(
        self,
        velocity: torch.Tensor,
        reference_velocity: torch.Tensor,
        target_velocity: torch.Tensor,
        rewards: torch.Tensor,
    ) -> tuple[torch.Tensor, Metrics]:
        reduce = per_sample_mean if self.reduction == "mean" else _per_sample_sum
        error = reduce((target_velocity - velocity) ** 2, 2)  # [U, k]
        with torch.no_grad():
            reference_error = reduce((target_velocity - reference_velocity) ** 2, 2)
        implicit = -self.beta * (error - reference_error)
        order = rewards.argsort(dim=1, descending=True, stable=True)
        s = implicit.gather(1, order)
        r = rewards.gather(1, order).float()
        k = s.shape[1]
        rank_loss = s.new_zeros(s.shape[0])
        for i in range(k - 1):
            rest_r = r[:, i:]
            if self.tau > 0:
                q = torch.softmax(rest_r / self.tau, dim=1)
            else:  # the limit tau -> 0: equal weight on the best remaining members (ties)
                q = (rest_r == rest_r[:, :1]).float()
                q = q / q.sum(dim=1, keepdim=True)
            rank_loss = rank_loss + torch.logsumexp(s[:, i:], dim=1) - (q * s[:, i:]).sum(dim=1)
        # The flow-matching term on the best sample; members tied for best share it, so that
        # the loss does not depend on the order of equal rewards.
        errors = per_sample_mean((target_velocity - velocity) ** 2, 2).gather(1, order)  # [U, k]
        is_best = (r == r[:, :1]).float()
        best_error = (errors * is_best).sum(dim=1) / is_best.sum(dim=1)
        loss = rank_loss.mean() + self.gamma * best_error.mean()
        with torch.no_grad():
            top_prob = torch.softmax(s, dim=1)[:, 0]
            metrics = {
                "rank_loss": rank_loss.mean(),
                "best_flow_matching": best_error.mean(),
                "implicit_reward_spread": (s.max(1).values - s.min(1).values).mean(),
                "best_probability": top_prob.mean(),
                "ranking_accuracy": (
                    (s[:, :-1] >= s[:, 1:]).float().mean() if k > 1 else torch.ones(())
                ),
            }
        return loss, metrics


def _per_sample_sum(x: torch.Tensor, batch_dims: int = 1) -> torch.Tensor:
    return x.flatten(batch_dims).sum(dim=-1)


@dataclass
class NFTLoss:
    """DiffusionNFT's negative-aware fine-tuning loss (Zheng et al. 2025, arXiv 2509.16117, eq. 8
    with the released code's adaptive weighting and scale).

    Implicit policies mix the current velocity ``v`` and the old (sampling) policy's ``v_old``:
    ``v+ = beta v + (1 - beta) v_old``, ``v- = (1 + beta) v_old - beta v``. Each is scored in
    ``x_0`` space, ``e = x_t - t v* - x_0``, normalised by its own detached mean absolute error,
    ``L* = mean_dims(e^2) / max(mean_dims|e|, 1e-5)``. With the optimality probability ``r``:

    ``L = scale * mean(r L+ + (1 - r) L-) / beta + kl_beta * mean(mean_dims (v - v_ref)^2)``

    At ``r = 0.5`` and ``v_old = v`` the two policy terms' gradients cancel exactly.

    Args:
        beta: the guidance strength beta (1.0; 0.1 for OCR and multi-reward).
        scale: constant factor (the reference multiplies by its advantage clip, 5).
        kl_beta: weight of the velocity-space KL to the reference (1e-4).

    Shapes: velocities and ``clean``/``noised`` ``[U, *event]``; ``sigma``, ``optimality`` ``[U]``.
    """

    beta: float
    scale: float = 5.0
    kl_beta: float = 1e-4

    def __call__(
        self,
        velocity: torch.Tensor,
        old_velocity: torch.Tensor,
        reference_velocity: torch.Tensor | None,
        noised: torch.Tensor,
        clean: torch.Tensor,
        sigma: torch.Tensor,
        optimality: torch.Tensor,
    ) -> tuple[torch.Tensor, Metrics]:
        old = old_velocity.detach()
        positive_loss, negative_loss = self.branch_losses(velocity, old, noised, clean, sigma)
        policy_loss = self.policy_loss(positive_loss, negative_loss, optimality)
        loss = policy_loss
        metrics = {
            "policy_loss": policy_loss.detach(),
            "positive_loss": positive_loss.detach().mean(),
            "negative_loss": negative_loss.detach().mean(),
            "optimality_mean": optimality.detach().mean(),
        }
        if reference_velocity is not None and self.kl_beta > 0:
            kl = per_sample_mean((velocity - reference_velocity.detach()) ** 2).mean()
            loss = loss + self.kl_beta * kl
            metrics["kl"] = kl.detach()
        with torch.no_grad():
            metrics["old_distance"] = per_sample_mean((velocity - old) ** 2).mean()
        return loss, metrics

    def branch_losses(
        self,
        velocity: torch.Tensor,
        old_velocity: torch.Tensor,
        noised: torch.Tensor,
        clean: torch.Tensor,
        sigma: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L+, L-)`` per unit ``[U]``: the two implicit policies' normalised errors, which do
        not depend on ``r`` (so the loss is affine in ``r``; MARBLE builds on this)."""
        t = sigma.view(-1, *([1] * (velocity.dim() - 1)))
        positive = self.beta * velocity + (1 - self.beta) * old_velocity
        negative = (1 + self.beta) * old_velocity - self.beta * velocity
        positive_loss = _normalised_x0_error(noised - t * positive - clean)
        negative_loss = _normalised_x0_error(noised - t * negative - clean)
        return positive_loss, negative_loss

    def policy_loss(
        self, positive_loss: torch.Tensor, negative_loss: torch.Tensor, optimality: torch.Tensor
    ) -> torch.Tensor:
        """``scale * mean(r L+ + (1 - r) L-) / beta``; ``optimality`` ``[U]``, or ``[U, K]``
        for ``K`` losses at once (returns ``[K]``)."""
        if optimality.dim() == 2:
            positive_loss, negative_loss = positive_loss[:, None], negative_loss[:, None]
        per_sample = (optimality * positive_loss + (1 - optimality) * negative_loss) / self.beta
        return self.scale * per_sample.mean(dim=0)


def _normalised_x0_error(error: torch.Tensor) -> torch.Tensor:
    """``mean_dims(e^2) / stopgrad(max(mean_dims|e|, 1e-5))`` per sample (the reference computes
    the weight in float64)."""
    with torch.no_grad():
        weight = per_sample_mean(error.double().abs()).clamp_min(1e-5).to(error.dtype)
    return per_sample_mean(error**2) / weight
