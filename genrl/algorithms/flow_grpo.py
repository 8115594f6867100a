"""Flow-GRPO: GRPO for flow-matching generators through a stochastic (SDE) sampler.

Liu et al., "Flow-GRPO: Training Flow Matching Models via Online RL" (2025). Each prompt's group of
images is sampled with the SDE of ``samplers.flow_sde`` so that every denoising step is a Gaussian
policy with a tractable log-prob (eq. 9-10). Rewards become per-prompt advantages (eq. 4); each
trained step contributes a PPO-clipped ratio term plus a KL to the reference policy on the step
means (eq. 12):

    L = mean_{i, t} max(-A_i r_{i,t}, -A_i clip(r_{i,t}, 1 - eps, 1 + eps))
        + beta * KL(pi_theta(.|x_t) || pi_ref(.|x_t)),   r_{i,t} = pi_theta / pi_old.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from genrl.advantages import PerPromptStatTracker, clip_advantages
from genrl.algorithms.base import (
    Algorithm,
    AlgorithmConfig,
    RolloutNoise,
    StepContext,
    register_algorithm,
)
from genrl.algorithms.flow_rollout import FlowRollout, decode_in_chunks
from genrl.losses import ClippedSurrogate, gaussian_mean_kl
from genrl.overrides import ConfigError
from genrl.regression_losses import per_sample_mean
from genrl.rollout import FlowTrajectory, FlowTransitions, SharedRows

DROP_REFILL_TAG = 10_500  # RolloutNoise stream: zero-advantage trajectories taken back


@dataclass
class FlowGRPOConfig(AlgorithmConfig):
    name: str = "flow_grpo"
    """Registry name."""
    clip_range: float = 1e-4
    """PPO clip range epsilon (low side, and high side unless set); Flow-GRPO: 1e-4 with
    mean-reduced log-probs (1e-5 for Flow-GRPO-Fast)."""
    clip_range_high: float | None = None
    """Separate upper clip range (DAPO clip-higher); None = ``clip_range``."""
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
    kl_reward: float = 0.0
    """Flow-GRPO's ``kl_reward``: every step's reward becomes the final reward minus this times
    that step's KL to the reference, measured while sampling (one more forward per step), and
    advantages are normalised step by step; 0 disables it."""
    clip_ratio_c: float | None = None
    """Dual-clip bound (> 1) on the ratio of negative-advantage transitions (verl's
    ``clip_ratio_c``, 3 there); None (Flow-GRPO) disables it."""
    ratio_norm: bool = False
    """GRPO-Guard (Wang et al. 2025, arXiv 2510.22319; released in Flow-GRPO's
    ``train_sd3_GRPO_Guard.py``): the log-ratio becomes ``s * (log_ratio + mean((mu -
    mu_old)^2) / (2 s^2))`` with ``s`` the transition std, which removes the negative bias of the
    ratio and equalises its spread across steps, and each transition's policy loss is divided by
    its ``|dt|``. The released configs pair it with clip ranges of 2e-6 (4e-6 for PickScore)."""
    drop_zero_advantages: bool = True
    """Leave trajectories whose advantages are all zero out of training, as Flow-GRPO does
    (``train_sd3.py``); a few of them come back at random when too few remain to fill the
    iteration's minibatches."""
    timestep_fraction: float = 0.99
    """Fraction of the sampling steps trained per trajectory (Flow-GRPO: 0.99 -> 9 of 10);
    with an SDE window (``sampler.sde_window_size``) every window step is trained."""
    timestep_selection: Literal["prefix", "random"] = "prefix"
    """Which steps: the first ones in sampling order (the Flow-GRPO reference trains steps
    0..k-1) or a random subset per trajectory (DanceGRPO-style)."""
    std_mode: Literal["group", "global", "none"] = "global"
    """Advantage normaliser: per-prompt std, std of the whole gathered batch (Flow-GRPO's SD3
    configs, ``global_std``) or none."""
    std_estimator: Literal["sample", "population"] = "population"
    """Std of the normaliser: Flow-GRPO's ``np.std`` (population) or Bessel's (sample)."""
    std_eps: float = 1e-4
    """Added to the std (Flow-GRPO: 1e-4)."""
    stat_history: int = 1
    """Iterations of per-prompt rewards pooled in the baseline (1 = current batch only)."""
    advantage_clip: float | None = 5.0
    """Clamp advantages to +-this (Flow-GRPO: 5)."""
    cfg_in_training: bool = True
    """With ``sampler.guidance_scale > 1``, recompute log-probs with CFG (cond and uncond in one
    batched forward), as Flow-GRPO does; False trains the conditional velocity. Whether the
    unconditional branch gets gradients is the diffusers adapters' ``detach_uncond`` option
    (Flow-GRPO trains both since its commit a482878; the SD3 recipes set it off)."""

    def validate(self, train_config: Any = None) -> None:
        if train_config is not None:
            sampler = train_config.sampler
            if sampler.noise_level <= 0:
                raise ConfigError(
                    "sampler.noise_level must be > 0 for flow_grpo: a deterministic step has no "
                    "log-prob to train (use `genrl eval` to sample with the ODE)"
                )
            if sampler.guidance_scale != 1 and not self.cfg_in_training:
                raise ConfigError(
                    "algorithm.cfg_in_training=false needs sampler.guidance_scale=1: rollout "
                    "log-probs come from the guided velocity, so training without CFG would be "
                    "off-policy from the first step"
                )
        if self.clip_range <= 0:
            raise ConfigError(f"algorithm.clip_range must be positive, got {self.clip_range}")
        if self.clip_range_high is not None and self.clip_range_high <= 0:
            raise ConfigError(
                f"algorithm.clip_range_high must be positive, got {self.clip_range_high}"
            )
        if self.kl_beta < 0:
            raise ConfigError(f"algorithm.kl_beta must be >= 0, got {self.kl_beta}")
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(
                f"algorithm.timestep_fraction must lie in (0, 1], got {self.timestep_fraction}"
            )
        if self.stat_history < 1:
            raise ConfigError(f"algorithm.stat_history must be >= 1, got {self.stat_history}")
        if self.kl_reward < 0:
            raise ConfigError(f"algorithm.kl_reward must be >= 0, got {self.kl_reward}")
        if self.kl_reward > 0 and self.stat_history > 1:
            raise ConfigError(
                "algorithm.kl_reward gives one reward per step, which cannot be pooled over "
                "iterations: set algorithm.stat_history=1"
            )
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ConfigError(f"algorithm.clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.std_eps < 0:
            raise ConfigError(f"algorithm.std_eps must be >= 0, got {self.std_eps}")
        reduction = None if train_config is None else train_config.sampler.log_prob_reduction
        if self.ratio_norm and reduction not in (None, "mean"):
            raise ConfigError(
                "algorithm.ratio_norm (GRPO-Guard) normalises mean-reduced log-probs: set "
                "sampler.log_prob_reduction=mean"
            )


@register_algorithm("flow_grpo")
class FlowGRPO(Algorithm):
    Config = FlowGRPOConfig
    config: FlowGRPOConfig

    def __init__(self, config: FlowGRPOConfig, train_config: Any) -> None:
        super().__init__(config, train_config)
        self.surrogate = ClippedSurrogate(
            config.clip_range, config.clip_range_high, config.clip_ratio_c
        )
        self.tracker = PerPromptStatTracker(
            config.std_mode, config.stat_history, config.std_eps, config.std_estimator
        )
        self.rollout: FlowRollout | None = None

    def setup(self, policy: Any) -> None:
        """Build the samplers on the policy's noise schedule (its pipeline's own scheduler)."""
        self.rollout = FlowRollout.from_config(
            self.train_config,
            policy,
            measure_kl=self.config.kl_reward > 0,
            keep_means=self.config.ratio_norm,
        )
        if self.rollout.trainable_per_trajectory == 0:
            s = self.train_config.sampler
            hint = "raise sampler.noise_level"
            if s.sde_window_size:
                hint = (
                    "the window can land on deterministic steps only (CPS's last step has no "
                    f"noise): raise sde_window_size or keep it off the last step, e.g. "
                    f"sampler.sde_window_range=[0, {s.num_steps - 1}]"
                )
            raise ConfigError(f"sampler {s.name!r} has no stochastic step to train: {hint}")

    @property
    def sampler(self) -> Any:
        """The stochastic sampler (available after ``setup``)."""
        if self.rollout is None:
            raise RuntimeError("FlowGRPO.setup(policy) must be called before sampling")
        return self.rollout.sde

    @property
    def guidance_scale(self) -> float:
        """CFG scale of rollouts (and of training when ``cfg_in_training``)."""
        return self.train_config.sampler.guidance_scale

    @property
    def num_train_steps(self) -> int:
        """Steps trained per trajectory: ``timestep_fraction`` of its stochastic steps, or every
        step of an SDE window (Flow-GRPO-Fast and MixGRPO train the whole window)."""
        assert self.rollout is not None
        trainable = self.rollout.trainable_per_trajectory
        if self.rollout.window_size:
            return trainable
        return max(1, int(trainable * self.config.timestep_fraction))

    def num_units(self, num_samples: int) -> int:
        return num_samples * self.num_train_steps

    def collect(
        self, policy: Any, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> FlowTrajectory:
        if self.rollout is None:
            self.setup(policy)
        assert self.rollout is not None
        return self.rollout.collect(policy, prompts, group_ids, noise)

    def final_outputs(self, policy: Any, rollout: FlowTrajectory) -> torch.Tensor:
        """Decoded images, in chunks of ``train.rollout_batch_size`` (the VAE of a real model at
        512 px is a memory peak when it decodes a whole local batch)."""
        return decode_in_chunks(policy, rollout.final, self.train_config.train.rollout_batch_size)

    def advantage_inputs(self, rollout: FlowTrajectory) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """The per-step KL measured while sampling, when ``kl_reward`` uses it."""
        if self.config.kl_reward > 0 and rollout.step_kl is not None:
            return {"step_kl": rollout.step_kl}
        return {}

    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        """Per-prompt normalised rewards, clipped (``[N]``); with ``kl_reward``, one reward per
        step, ``r - kl_reward * kl_t``, normalised column by column (``[N, T]``)."""
        del group_ids  # groups are keyed by prompt text, as in Flow-GRPO's stat tracker
        if "step_kl" in inputs:
            rewards = rewards[:, None] - self.config.kl_reward * inputs["step_kl"].to(rewards)
        return clip_advantages(self.tracker.update(prompts, rewards), self.config.advantage_clip)

    def training_units(self, rollout: FlowTrajectory, noise: RolloutNoise) -> FlowTransitions:
        """Pick ``num_train_steps`` trainable steps per trajectory and flatten them (without the
        trajectories whose advantages are all zero, with ``drop_zero_advantages``)."""
        n, num_steps = rollout.log_probs.shape
        k = self.num_train_steps
        # Keys of non-trainable steps are pushed past every trainable one so they are never picked.
        device = rollout.latents.device
        if self.config.timestep_selection == "random":
            keys = noise.rand(10_000, (num_steps,)).to(device)
        else:  # prefix: sampling order, first trainable steps first
            keys = torch.arange(num_steps, device=device, dtype=torch.float32).expand(n, -1)
        keys = keys + num_steps * (~rollout.trainable_steps).float()
        available = int(rollout.trainable_steps.sum(dim=1).min()) if n else k
        if available < k:
            raise ValueError(
                f"a trajectory has {available} trainable steps but {k} are to be trained per "
                "trajectory (the rollout's window and the sampler disagree)"
            )
        steps = keys.argsort(dim=1)[:, :k]  # [n, k]
        rows = torch.arange(n, device=device).unsqueeze(1).expand(n, k)
        advantages = rollout.advantages
        if advantages.ndim == 2:
            advantages = advantages.gather(1, steps)  # [n, k]
        else:
            advantages = advantages[:, None].expand(n, k)
        if self.config.drop_zero_advantages:
            kept = self._rows_to_train(advantages, noise)
            rows, steps, advantages = rows[kept], steps[kept], advantages[kept]
        flat_rows, flat_steps = rows.reshape(-1), steps.reshape(-1)
        means = rollout.means
        return FlowTransitions(
            rows=flat_rows,
            conditions=SharedRows(rollout.condition),
            sample=rollout.latents[flat_rows, flat_steps],
            next_sample=rollout.latents[flat_rows, flat_steps + 1],
            timestep_index=flat_steps,
            old_log_probs=rollout.log_probs[flat_rows, flat_steps],
            advantages=advantages.reshape(-1),
            old_means=None if means is None else means[flat_rows, flat_steps],
        )

    def _rows_to_train(self, advantages: torch.Tensor, noise: RolloutNoise) -> torch.Tensor:
        """Trajectories with a non-zero advantage; when fewer remain than the iteration's planned
        minibatches need, zero-advantage ones chosen at random fill up (Flow-GRPO likewise adds
        random ones back so that its batches divide evenly)."""
        nonzero = (advantages != 0).any(dim=1)
        n, k = advantages.shape
        minibatches = math.ceil(n * k / self.train_config.train.minibatch_size)
        needed = min(n, math.ceil(minibatches / k))
        missing = needed - int(nonzero.sum())
        if missing > 0:
            zero_rows = (~nonzero).nonzero()[:, 0]
            order = noise.local_permutation(DROP_REFILL_TAG, len(zero_rows)).to(zero_rows.device)
            nonzero[zero_rows[order[:missing]]] = True
        return nonzero.nonzero()[:, 0]

    def loss(
        self, policy: Any, minibatch: FlowTransitions, step: StepContext | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mb = minibatch
        guidance = self.guidance_scale if self.config.cfg_in_training else 1.0
        sigmas = self.sampler.sigmas.to(mb.sample.device)
        sigma = sigmas[mb.timestep_index]
        v = policy.velocity(mb.sample, sigma, mb.condition, guidance)
        out = self.rescore(v, mb)
        if self.config.ratio_norm:
            loss, metrics = self._guarded_surrogate(out, mb, sigmas)
        else:
            loss, metrics = self.surrogate(out.log_prob, mb.old_log_probs, mb.advantages)
        metrics["policy_loss"] = float(loss.detach())
        if self.config.kl_beta > 0:
            with torch.no_grad(), policy.reference():
                v_ref = policy.velocity(mb.sample, sigma, mb.condition, guidance)
            ref_mean = self.rescore(v_ref, mb).mean
            std = out.std
            if self.config.kl_form == "flow_grpo":
                std = self.sampler.reference_std(mb.timestep_index, mb.sample)
            kl = gaussian_mean_kl(out.mean, ref_mean, std, self.sampler.log_prob_reduction)
            kl = kl.mean()
            loss = loss + self.config.kl_beta * kl
            metrics["kl_loss"] = float(kl.detach())
        return loss, metrics

    def _guarded_surrogate(
        self, out: Any, mb: FlowTransitions, sigmas: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """GRPO-Guard's ratio normalisation and per-step reweighting (its
        ``train_sd3_GRPO_Guard.py``): with ``s`` the transition std,
        ``log r = s * (lp - lp_old + mean((mu - mu_old)^2) / (2 s^2))``, which equals
        ``mean((mu - mu_old) * eps)`` for the stored noise ``eps``; each transition's clipped
        term is divided by its step's ``|dt|``."""
        if mb.old_means is None:
            raise ValueError("ratio_norm needs the rollout's step means (FlowRollout.keep_means)")
        s = out.std
        bias = per_sample_mean((out.mean - mb.old_means).square()) / (2 * s.square())
        log_ratio = s * (out.log_prob - mb.old_log_probs + bias)
        dt = (sigmas[mb.timestep_index] - sigmas[mb.timestep_index + 1]).abs()
        return self.surrogate(log_ratio, torch.zeros_like(log_ratio), mb.advantages, 1 / dt)

    def rescore(self, velocity: torch.Tensor, mb: FlowTransitions) -> Any:
        """The step output of each transition under the density it was drawn from."""
        return self.sampler.step(velocity, mb.timestep_index, mb.sample, prev_sample=mb.next_sample)

    def state_dict(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state["tracker"])
