"""MARBLE: one advantage per reward, per-reward policy gradients balanced by the min-norm
quadratic program, amortised on DiffusionNFT's affine loss (Zhao et al. 2026, arXiv
2605.06507; the formulas and choices are in ``docs/algorithms/marble.md``).

The per-reward pieces:

1. Advantages. Each balanced reward ``k`` gets its own DiffusionNFT advantage (per-prompt mean,
   the configured std, clip to ``A_max``) and so its own optimality ``r_k = A_k / (2 A_max) +
   1/2``. A sample a reward does not apply to (a NaN score) gets ``A_k = 0``, ``r_k = 1/2``:
   no push either way from that reward. ``advantages`` returns ``[N, 1 + K]``: column 0 is the
   advantage of the run's aggregated (weighted-sum) reward, as ``diffusion_nft`` computes it
   (trained on by the ``weighted_sum`` baseline, logged otherwise), columns 1..K the
   per-reward ones in ``reward_names`` order.
2. The affine loss. DiffusionNFT's policy loss is affine in ``r`` at every unit:
   ``l_i(r) = (r L+_i + (1 - r) L-_i) / beta`` with ``L+``, ``L-`` independent of ``r``. So one
   forward gives all ``K`` per-reward losses ``L_k = scale mean_i l_i(r_ik)``, and any convex
   mix of their gradients ``sum_k w_k grad L_k`` is the gradient of one DiffusionNFT loss with
   the mixed optimality ``r~ = sum_k w_k r_k`` (a probability again): the update costs one
   backward, like single-reward training.
3. Balancing. On a balancing minibatch the ``K`` gradients ``g_k = grad L_k`` (of the
   trainable parameters, each a backward through the graph of the one forward; or of the
   velocities, which need none) are reduced to their Gram matrix, normalised, and the min-norm
   program gives ``alpha`` (``genrl/objectives/gradient_balancing.py``); the mixing weights
   ``w* ~ alpha_k / |g_k|`` are smoothed by an EMA and reused for ``balance_every - 1``
   further minibatches.

Logged per balancing minibatch (``loss/balance/...``): the program's ``alpha/<reward>``, the
smoothed ``weight/<reward>``, each reward's gradient cosine with the update direction
``cosine/<reward>``, the smallest ``worst_cosine`` and ``worst_negative`` (1 when it is < 0;
its mean over an iteration is the fraction of minibatches where the worst-aligned reward's
gradient is anti-aligned with the update, the paper's diagnostic).

With several processes the Gram matrix is this process's minibatch's, so the weights may differ
between processes (their gradients are still averaged); one process is what is tested.
"""

from __future__ import annotations

from typing import Any

import torch

from genrl.data.batches import NoisedEndpoints
from genrl.objectives.advantages import PerPromptStatTracker, clip_advantages, group_moments
from genrl.objectives.balancing_configs import MarbleObjectiveConfig
from genrl.objectives.base import StepContext
from genrl.objectives.gradient_balancing import (
    cosines_with,
    flat_gradient_gram,
    min_norm_weights,
    normalised_gram,
)
from genrl.objectives.losses import Metrics
from genrl.objectives.regression import unit_velocity
from genrl.objectives.regression_objectives import NFTObjective, apply_adv_mode
from genrl.policies.protocols import FlowPolicy


def fill_missing_with_group_mean(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` scores with each NaN replaced by its group's mean of that reward's finite
    scores (0 for a group with none), so that it is centred to exactly 0."""
    filled = scores.clone().float()
    for k in range(scores.shape[1]):
        column = filled[:, k]
        valid = torch.isfinite(column)
        if bool(valid.all()):
            continue
        means, _, inverse = group_moments(torch.where(valid, column, 0.0), group_ids)
        counts, _, _ = group_moments(valid.float(), group_ids)
        # group_moments returns means: mean(x * valid) / mean(valid) is the finite mean.
        finite_mean = torch.where(counts > 0, means / counts.clamp(min=1e-12), 0.0)
        filled[:, k] = torch.where(valid, column, finite_mean[inverse])
    return filled


class MarbleObjective(NFTObjective):
    """DiffusionNFT's loss (``NFTObjective``) with per-reward advantages and balanced gradients.

    Args:
        config: the algorithm's fields (``NFTObjectiveConfig`` and ``BalancingConfig``).
        rollout: the endpoint rollout with its lagged copy.
        group_size: samples per group.
        reward_names: the balanced rewards, in the order of the advantages' columns 1..K.
    """

    def __init__(
        self,
        config: MarbleObjectiveConfig,
        rollout: Any,
        group_size: int,
        reward_names: list[str],
    ) -> None:
        super().__init__(config, rollout, group_size)
        self.config: MarbleObjectiveConfig = config
        self.names = tuple(reward_names)
        self.reward_tracker = PerPromptStatTracker(config.std_mode, 1)
        self.weights: torch.Tensor | None = None  # the smoothed mixing weights w, [K]
        self.minibatches = 0

    @property
    def reward_names(self) -> tuple[str, ...]:
        return self.names

    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        """``[N, 1 + K]``: the aggregated reward's advantage, then one per balanced reward."""
        scores = inputs.pop("reward_scores")
        combined = super().advantages(rewards, prompts, group_ids, **inputs)
        missing = ~torch.isfinite(scores)
        filled = fill_missing_with_group_mean(scores, group_ids)
        per_reward = clip_advantages(
            self.reward_tracker.update(prompts, filled), self.config.advantage_clip
        )
        per_reward = apply_adv_mode(per_reward, self.config.adv_mode)
        per_reward = torch.where(missing.to(per_reward.device), 0.0, per_reward)
        return torch.cat([combined.reshape(-1, 1), per_reward.to(combined)], dim=1)

    def advantage_metrics(self, advantages: torch.Tensor) -> dict[str, float]:
        """Column 0 (the aggregated reward's advantage) as every objective reports it, and
        ``advantages/<reward>/abs_mean`` for each balanced reward's column."""
        metrics = super().advantage_metrics(advantages[:, 0])
        for column, name in enumerate(self.names, start=1):
            metrics[f"advantages/{name}/abs_mean"] = float(advantages[:, column].abs().mean())
        return metrics

    def loss(
        self, policy: FlowPolicy, minibatch: NoisedEndpoints, step: StepContext | None = None
    ) -> tuple[torch.Tensor, Metrics]:
        del step
        c, mb, k = self.config, minibatch, len(self.names)
        reference = None
        with torch.no_grad():
            with self.rollout.lagged_weights():
                old = unit_velocity(policy, mb).flatten(0, 1)
            if c.kl_beta > 0:
                with policy.reference():
                    reference = unit_velocity(policy, mb).flatten(0, 1)
        velocity = unit_velocity(policy, mb).flatten(0, 1)
        optimality = self.optimality(mb.advantages.reshape(-1, 1 + k))  # [U, 1 + K]
        positive_loss, negative_loss = self.loss_fn.branch_losses(
            velocity,
            old,
            mb.noised.flatten(0, 1),
            mb.clean.flatten(0, 1),
            mb.sigma.repeat_interleave(mb.clean.shape[1]),
        )
        metrics: Metrics = {}
        balancing = self.minibatches % c.balance_every == 0
        self.minibatches += 1
        if c.balancing == "weighted_sum":
            mixed = optimality[:, 0]
            if balancing:
                # Diagnostics only: the update's gradient is column 0's, compared with each
                # reward's; nothing here changes what is trained.
                losses = self.loss_fn.policy_loss(positive_loss, negative_loss, optimality)
                gram = self._gram(losses, policy, velocity)
                update = torch.zeros(1 + k, dtype=torch.float64)
                update[0] = 1.0
                metrics.update(self._alignment(gram[1:, 1:], gram, update, None))
        else:
            if balancing or self.weights is None:
                losses = self.loss_fn.policy_loss(positive_loss, negative_loss, optimality[:, 1:])
                metrics.update(self._balance(self._gram(losses, policy, velocity)))
            assert self.weights is not None
            mixed = optimality[:, 1:] @ self.weights.to(optimality)
        policy_loss = self.loss_fn.policy_loss(positive_loss, negative_loss, mixed)
        loss = policy_loss
        metrics.update(
            {
                "policy_loss": policy_loss.detach(),
                "positive_loss": positive_loss.detach().mean(),
                "negative_loss": negative_loss.detach().mean(),
                "optimality_mean": mixed.detach().mean(),
            }
        )
        if reference is not None:
            kl = (velocity - reference.detach()).pow(2).flatten(1).mean(1).mean()
            loss = loss + c.kl_beta * kl
            metrics["kl"] = kl.detach()
        return loss, metrics

    def _gram(
        self, losses: torch.Tensor, policy: FlowPolicy, velocity: torch.Tensor
    ) -> torch.Tensor:
        """Gram matrix of the gradients of ``losses`` ``[J]``, in the configured space; the
        graph is kept for the update's backward."""
        inputs: list[torch.Tensor]
        if self.config.gradient_space == "velocity":
            inputs = [velocity]
        else:
            inputs = [p for p in policy.trainable_parameters() if p.requires_grad]
        gradients = [
            list(torch.autograd.grad(loss_j, inputs, retain_graph=True, allow_unused=True))
            for loss_j in losses
        ]
        return flat_gradient_gram(gradients)  # type: ignore[arg-type]

    def _balance(self, gram: torch.Tensor) -> Metrics:
        """Solve the program on the normalised gradients, update the smoothed weights."""
        c = self.config
        unit, norms = normalised_gram(gram)
        # A reward whose gradient vanishes (no signal in this minibatch: every advantage 0 and
        # the policy still at the old one) would be the hull's min-norm point by itself and
        # stop every other reward; it is left out of the program instead (weight 0).
        active = norms > 1e-12 * float(norms.max()) if float(norms.max()) > 0 else norms >= 0
        alpha = torch.zeros(len(norms), dtype=torch.float64)
        index = active.nonzero().flatten()
        alpha[index] = min_norm_weights(unit[index][:, index], c.solver, c.solver_iters)
        if c.direction == "normalized":
            inverse = torch.where(norms > 0, 1 / norms.clamp(min=1e-30), torch.zeros_like(norms))
            target = alpha * inverse
            target = target / target.sum() if float(target.sum()) > 0 else alpha
        else:
            target = alpha
        if self.weights is None:
            self.weights = target.float()
        else:
            self.weights = (
                c.balance_ema * self.weights.double() + (1 - c.balance_ema) * target
            ).float()
        return self._alignment(gram, gram, self.weights, alpha, unit)

    def _alignment(
        self,
        reward_gram: torch.Tensor,
        full_gram: torch.Tensor,
        update: torch.Tensor,
        alpha: torch.Tensor | None,
        unit: torch.Tensor | None = None,
    ) -> Metrics:
        """Each reward's cosine with the update ``sum_j update_j g_j`` (over ``full_gram``'s
        gradients; the rewards are its last ``K``) and the weights."""
        k = len(self.names)
        cosines = cosines_with(full_gram, update.double())[-k:]
        metrics: Metrics = {}
        for i, name in enumerate(self.names):
            metrics[f"balance/cosine/{name}"] = cosines[i].float()
            metrics[f"balance/grad_norm/{name}"] = reward_gram[i, i].clamp(min=0).sqrt().float()
            if alpha is not None:
                metrics[f"balance/alpha/{name}"] = alpha[i].float()
                metrics[f"balance/weight/{name}"] = update[i].float()
        worst = cosines.min().float()
        metrics["balance/worst_cosine"] = worst
        metrics["balance/worst_negative"] = (worst < 0).float()
        if unit is not None and alpha is not None:
            metrics["balance/min_norm"] = (alpha @ unit @ alpha).clamp(min=0).sqrt().float()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["reward_tracker"] = self.reward_tracker.state_dict()
        state["weights"] = None if self.weights is None else self.weights.tolist()
        state["minibatches"] = self.minibatches
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.reward_tracker.load_state_dict(state["reward_tracker"])
        weights = state["weights"]
        self.weights = None if weights is None else torch.tensor(weights, dtype=torch.float32)
        self.minibatches = int(state["minibatches"])


__all__ = ["MarbleObjective", "fill_missing_with_group_mean"]
