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

from dataclasses import dataclass
from typing import Any, Literal

import torch

from genrl.config.errors import ConfigError
from genrl.data.batches import FlowTransitions
from genrl.objectives.losses import ClippedSurrogate, Metrics, gaussian_mean_kl
from genrl.objectives.regression_losses import per_sample_mean
from genrl.policies.protocols import FlowPolicy


@dataclass
class FlowStepLossConfig:
    """Fields of the flow-step loss (every flow policy-gradient algorithm documents its
    defaults)."""

    clip_range: float = 1e-4
    """PPO clip range epsilon (low side, and high side unless set); Flow-GRPO: 1e-4 with
    mean-reduced log-probs (1e-5 for Flow-GRPO-Fast)."""
    clip_range_high: float | None = None
    """Separate upper clip range (DAPO clip-higher); None = ``clip_range``."""
    clip_ratio_c: float | None = None
    """Dual-clip bound (> 1) on the ratio of negative-advantage transitions (verl's
    ``clip_ratio_c``, 3 there); None (Flow-GRPO) disables it."""
    kl_beta: float = 0.04
    """Weight of the KL to the reference on the step means; 0 skips the reference forward.
    Flow-GRPO uses 0.04 (GenEval/OCR), 0.01 (PickScore), 0 (Fast); with ``kl_form=flow_grpo``
    its values carry over as they are."""
    kl_form: Literal["flow_grpo", "exact"] = "flow_grpo"
    """``flow_grpo``: ``mean((mu - mu_ref)^2) / (2 std_dev_t^2)`` with the sampler reference's
    ``std_dev_t`` (for the Flow-GRPO SDE the diffusion coefficient, without ``sqrt(-dt)``), as
    its ``train_sd3.py`` computes it: the exact KL times the step's ``|dt|``. ``exact``: the
    KL between the two Gaussian transitions, larger by ``1 / |dt|`` (4 to 28 across the 10-step
    shift-3 schedule), so the same ``kl_beta`` is stronger and weighs late steps more."""
    ratio_norm: bool = False
    """GRPO-Guard (Wang et al. 2025, arXiv 2510.22319; released in Flow-GRPO's
    ``train_sd3_GRPO_Guard.py``): the log-ratio becomes ``s * (log_ratio + mean((mu -
    mu_old)^2) / (2 s^2))`` with ``s`` the transition std, which removes the negative bias of the
    ratio and equalises its spread across steps, and each transition's policy loss is divided by
    its ``|dt|``. The released configs pair it with clip ranges of 2e-6 (4e-6 for PickScore)."""
    advantage_clip: float | None = 5.0
    """Clamp advantages to +-this (Flow-GRPO: 5)."""
    cfg_in_training: bool = True
    """With ``sampler.guidance_scale > 1``, recompute log-probs with CFG (cond and uncond in one
    batched forward), as Flow-GRPO does; False trains the conditional velocity. Whether the
    unconditional branch gets gradients is the diffusers adapters' ``detach_uncond`` option
    (Flow-GRPO trains both since its commit a482878; the SD3 recipes set it off)."""

    def validate_loss(self, train_config: Any = None) -> None:
        """Raise ``ConfigError`` naming the ``algorithm.*`` field that cannot work."""
        if self.clip_range <= 0:
            raise ConfigError(f"algorithm.clip_range must be positive, got {self.clip_range}")
        if self.clip_range_high is not None and self.clip_range_high <= 0:
            raise ConfigError(
                f"algorithm.clip_range_high must be positive, got {self.clip_range_high}"
            )
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ConfigError(f"algorithm.clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.kl_beta < 0:
            raise ConfigError(f"algorithm.kl_beta must be >= 0, got {self.kl_beta}")
        if train_config is None:
            return
        sampler = train_config.sampler
        if sampler.noise_level <= 0:
            raise ConfigError(
                f"sampler.noise_level must be > 0 for {train_config.algorithm.name}: a "
                "deterministic step has no log-prob to train (use `genrl eval` to sample with "
                "the ODE)"
            )
        if sampler.guidance_scale != 1 and not self.cfg_in_training:
            raise ConfigError(
                "algorithm.cfg_in_training=false needs sampler.guidance_scale=1: rollout "
                "log-probs come from the guided velocity, so training without CFG would be "
                "off-policy from the first step"
            )
        if self.ratio_norm and sampler.log_prob_reduction != "mean":
            raise ConfigError(
                "algorithm.ratio_norm (GRPO-Guard) normalises mean-reduced log-probs: set "
                "sampler.log_prob_reduction=mean"
            )


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

    def __call__(self, policy: FlowPolicy, mb: FlowTransitions) -> tuple[torch.Tensor, Metrics]:
        sampler = self.rollout.sampler
        sigmas = sampler.sigmas.to(mb.sample.device)
        sigma = sigmas[mb.timestep_index]
        v = policy.velocity(mb.sample, sigma, mb.condition, self.guidance)
        out = self.rollout.rescore(v, mb)
        if self.config.ratio_norm:
            loss, metrics = self._guarded(out, mb, sigmas)
        else:
            loss, metrics = self.surrogate(out.log_prob, mb.old_log_probs, mb.advantages)
        metrics["policy_loss"] = loss.detach()
        # Diagnostics (issue 31 item 3): how large the trained steps' log-probabilities are and
        # how much noise their transitions carry, which set how far one update moves the ratio.
        metrics["log_prob_abs_mean"] = out.log_prob.detach().abs().mean()
        metrics["transition_std_mean"] = out.std.detach().float().mean()
        if self.config.kl_beta > 0:
            with torch.no_grad(), policy.reference():
                v_ref = policy.velocity(mb.sample, sigma, mb.condition, self.guidance)
            ref_mean = self.rollout.rescore(v_ref, mb).mean
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
