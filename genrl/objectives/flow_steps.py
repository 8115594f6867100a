"""The loss of one stochastic flow step, shared by Flow-GRPO and BranchGRPO.

Each training unit is a transition ``x_t -> x_{t+1}`` drawn by a Gaussian sampler. The unit is
re-scored under the current velocity by its rollout (``rollout.rescore``, the sampler that drew
it), and the PPO-clipped surrogate of the ratio is averaged (Flow-GRPO, Liu et al. 2025, eq.
11-12), plus a KL to the reference on the step means:

    L = mean max(-A r, -A clip(r, 1 - eps, 1 + eps_high)) + beta * mean ||mu - mu_ref||^2 / (2 s^2)

``s`` is the reference implementation's ``std_dev_t`` (``kl_form="flow_grpo"``) or the
transition std (``"exact"``). With ``ratio_norm`` the log-ratio is GRPO-Guard's.
"""

from __future__ import annotations

from typing import Any

import torch

from genrl.data.batches import FlowTransitions
from genrl.objectives.flow_configs import FlowStepLossConfig
from genrl.objectives.losses import ClippedSurrogate, Metrics, gaussian_mean_kl
from genrl.objectives.regression_losses import per_sample_mean
from genrl.policies.protocols import FlowPolicy


class FlowStepLoss:
    """``(loss, metrics)`` of a minibatch of flow transitions (module docstring).

    Args:
        config: the loss fields.
        rollout: the rollout that drew the transitions (``rescore``, ``sampler``).
        guidance_scale: the rollout's CFG scale (used when ``cfg_in_training``).

    Shapes: ``FlowTransitions`` of ``U`` units: ``sample``/``next_sample`` ``[U, *event]``,
    ``timestep_index``, ``old_log_probs``, ``advantages`` ``[U]``.
    """

    def __init__(self, config: FlowStepLossConfig, rollout: Any, guidance_scale: float) -> None:
        self.config = config
        self.rollout = rollout
        self.guidance = guidance_scale if config.cfg_in_training else 1.0
        self.surrogate = ClippedSurrogate(
            config.clip_range, config.clip_range_high, config.clip_ratio_c
        )

    def model_output(self, policy: Any, mb: FlowTransitions) -> torch.Tensor:
        """What the rollout's step reads from the policy at the units' states: the velocity at
        their noise levels (``DiffusionStepLoss`` asks a diffusion model for its prediction at
        their timesteps instead)."""
        sigmas = self.rollout.sampler.sigmas.to(mb.sample.device)
        flow: FlowPolicy = policy
        return flow.velocity(mb.sample, sigmas[mb.timestep_index], mb.condition, self.guidance)

    def __call__(self, policy: Any, mb: FlowTransitions) -> tuple[torch.Tensor, Metrics]:
        sampler = self.rollout.sampler
        out = self.rollout.rescore(self.model_output(policy, mb), mb)
        if self.config.ratio_norm:
            loss, metrics = self._guarded(out, mb, sampler.sigmas.to(mb.sample.device))
        else:
            loss, metrics = self.surrogate(out.log_prob, mb.old_log_probs, mb.advantages)
        metrics["policy_loss"] = loss.detach()
        # Diagnostics (issue 31 item 3): how large the trained steps' log-probabilities are and
        # how much noise their transitions carry, which set how far one update moves the ratio.
        metrics["log_prob_abs_mean"] = out.log_prob.detach().abs().mean()
        metrics["transition_std_mean"] = out.std.detach().float().mean()
        if self.config.kl_beta > 0:
            with torch.no_grad(), policy.reference():
                ref_output = self.model_output(policy, mb)
            ref_mean = self.rollout.rescore(ref_output, mb).mean
            std = out.std
            if self.config.kl_form == "flow_grpo":
                std = sampler.reference_std(mb.timestep_index, mb.sample)
            kl = gaussian_mean_kl(out.mean, ref_mean, std, sampler.log_prob_reduction).mean()
            loss = loss + self.config.kl_beta * kl
            metrics["kl_loss"] = kl.detach()
        return loss, metrics

    def _guarded(
        self, out: Any, mb: FlowTransitions, sigmas: torch.Tensor
    ) -> tuple[torch.Tensor, Metrics]:
        """GRPO-Guard's ratio normalisation and per-step reweighting (its
        ``train_sd3_GRPO_Guard.py``): with ``s`` the transition std,
        ``log r = s * (lp - lp_old + mean((mu - mu_old)^2) / (2 s^2))``, which equals
        ``mean((mu - mu_old) * eps)`` for the stored noise ``eps``; each transition's clipped
        term is divided by its step's ``|dt|``."""
        if mb.old_means is None:
            raise ValueError("ratio_norm needs the rollout's step means (keep_means)")
        s = out.std
        bias = per_sample_mean((out.mean - mb.old_means).square()) / (2 * s.square())
        log_ratio = s * (out.log_prob - mb.old_log_probs + bias)
        dt = (sigmas[mb.timestep_index] - sigmas[mb.timestep_index + 1]).abs()
        return self.surrogate(log_ratio, torch.zeros_like(log_ratio), mb.advantages, 1 / dt)


__all__ = ["FlowStepLoss", "FlowStepLossConfig"]
