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

from dataclasses import dataclass
from typing import Any, Literal

import torch

from genrl.advantages import PerPromptStatTracker, clip_advantages
from genrl.algorithms.base import Algorithm, AlgorithmConfig, RolloutNoise, register_algorithm
from genrl.algorithms.flow_rollout import FlowRollout, decode_in_chunks
from genrl.losses import ClippedSurrogate, gaussian_mean_kl
from genrl.overrides import ConfigError
from genrl.rollout import FlowTrajectory, FlowTransitions, SharedRows


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
    Flow-GRPO uses 0.04 (GenEval/OCR), 0.01 (PickScore), 0 (Fast), but its KL divides by
    ``sigma_s^2`` where ours is the exact transition KL (divides by ``sigma_s^2 |dt|``): to carry
    its values over, multiply them by about ``1 / num_steps``."""
    timestep_fraction: float = 0.99
    """Fraction of the sampling steps trained per trajectory (Flow-GRPO: 0.99 -> 9 of 10);
    with an SDE window (``sampler.sde_window_size``) every window step is trained."""
    timestep_selection: Literal["prefix", "random"] = "prefix"
    """Which steps: the first ones in sampling order (the Flow-GRPO reference trains steps
    0..k-1) or a random subset per trajectory (DanceGRPO-style)."""
    std_mode: Literal["group", "global", "none"] = "global"
    """Advantage normaliser: per-prompt std, std of the whole gathered batch (Flow-GRPO's SD3
    configs, ``global_std``) or none."""
    stat_history: int = 1
    """Iterations of per-prompt rewards pooled in the baseline (1 = current batch only)."""
    advantage_clip: float | None = 5.0
    """Clamp advantages to +-this (Flow-GRPO: 5)."""
    cfg_in_training: bool = True
    """With ``sampler.guidance_scale > 1``, recompute log-probs with CFG (cond and uncond in one
    batched forward, uncond detached), as Flow-GRPO does; False trains the conditional velocity."""

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


@register_algorithm("flow_grpo")
class FlowGRPO(Algorithm):
    Config = FlowGRPOConfig
    config: FlowGRPOConfig

    def __init__(self, config: FlowGRPOConfig, train_config: Any) -> None:
        super().__init__(config, train_config)
        self.surrogate = ClippedSurrogate(config.clip_range, config.clip_range_high)
        self.tracker = PerPromptStatTracker(config.std_mode, config.stat_history)
        self.rollout: FlowRollout | None = None

    def setup(self, policy: Any) -> None:
        """Build the samplers on the policy's noise schedule (its pipeline's own scheduler)."""
        self.rollout = FlowRollout.from_config(self.train_config, policy)
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

    def advantages(
        self, rewards: torch.Tensor, prompts: list[str], group_ids: torch.Tensor
    ) -> torch.Tensor:
        del group_ids  # groups are keyed by prompt text, as in Flow-GRPO's stat tracker
        return clip_advantages(self.tracker.update(prompts, rewards), self.config.advantage_clip)

    def training_units(self, rollout: FlowTrajectory, noise: RolloutNoise) -> FlowTransitions:
        """Pick ``num_train_steps`` trainable steps per trajectory and flatten them."""
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
        flat_rows, flat_steps = rows.reshape(-1), steps.reshape(-1)
        return FlowTransitions(
            rows=flat_rows,
            conditions=SharedRows(rollout.condition),
            sample=rollout.latents[flat_rows, flat_steps],
            next_sample=rollout.latents[flat_rows, flat_steps + 1],
            timestep_index=flat_steps,
            old_log_probs=rollout.log_probs[flat_rows, flat_steps],
            advantages=rollout.advantages[flat_rows],
        )

    def loss(
        self, policy: Any, minibatch: FlowTransitions
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mb = minibatch
        guidance = self.guidance_scale if self.config.cfg_in_training else 1.0
        sigma = self.sampler.sigmas.to(mb.sample.device)[mb.timestep_index]
        v = policy.velocity(mb.sample, sigma, mb.condition, guidance)
        out = self.rescore(v, mb)
        loss, metrics = self.surrogate(out.log_prob, mb.old_log_probs, mb.advantages)
        metrics["policy_loss"] = float(loss.detach())
        if self.config.kl_beta > 0:
            with torch.no_grad(), policy.reference():
                v_ref = policy.velocity(mb.sample, sigma, mb.condition, guidance)
            ref_mean = self.rescore(v_ref, mb).mean
            kl = gaussian_mean_kl(out.mean, ref_mean, out.std, self.sampler.log_prob_reduction)
            kl = kl.mean()
            loss = loss + self.config.kl_beta * kl
            metrics["kl"] = float(kl.detach())
        return loss, metrics

    def rescore(self, velocity: torch.Tensor, mb: FlowTransitions) -> Any:
        """The step output of each transition under the density it was drawn from."""
        return self.sampler.step(velocity, mb.timestep_index, mb.sample, prev_sample=mb.next_sample)

    def state_dict(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state["tracker"])
