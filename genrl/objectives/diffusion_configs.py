"""Configs of the step-wise objectives on DDIM trajectories of diffusion models, without torch:
DDPO's (Black et al. 2023) per-prompt stat tracker and defaults.

Flow-GRPO's objective (``FlowPolicyGradientConfig``) applies to DDIM trajectories as it is
(``ddim_grpo``); DDPO's differs in its baseline (a buffer of each prompt's last rewards, with a
fallback to the batch's statistics while the buffer is short) and in its defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from genrl.config.errors import ConfigError
from genrl.objectives.flow_configs import FlowPolicyGradientConfig


def validate_ddim_objective(config: FlowPolicyGradientConfig, algorithm: str) -> None:
    """Refuse the Flow-GRPO options a DDIM rollout cannot serve."""
    if config.kl_reward > 0:
        raise ConfigError(
            f"algorithm.kl_reward: {algorithm}'s DDIM rollout does not measure the per-step KL "
            "while sampling; use algorithm.kl_beta for a KL to the reference"
        )
    if config.ratio_norm:
        raise ConfigError(
            f"algorithm.ratio_norm (GRPO-Guard) weighs each step by a flow schedule's |dt|; "
            f"{algorithm} samples DDIM steps, which have none: set algorithm.ratio_norm=false"
        )


@dataclass
class DDPOObjectiveConfig(FlowPolicyGradientConfig):
    """DDPO's PPO objective (``ddpo_pytorch/scripts/train.py``, ``config/base.py``): the
    step loss's fields with DDPO's defaults, and its stat tracker's."""

    clip_range: float = 1e-4
    """PPO clip range (DDPO ``train.clip_range``: 1e-4, with mean-reduced log-probs)."""
    kl_beta: float = 0.0
    """DDPO has no KL to the reference."""
    advantage_clip: float | None = 5.0
    """Clamp advantages to +-this (DDPO ``train.adv_clip_max``: 5)."""
    drop_zero_advantages: bool = False
    """DDPO trains every sample."""
    timestep_fraction: float = 1.0
    """Fraction of the steps trained per trajectory (DDPO ``train.timestep_fraction``: 1.0;
    ``int(num_steps * fraction)`` of them)."""
    timestep_selection: Literal["prefix", "random"] = "random"
    """DDPO shuffles each trajectory's timesteps independently and trains the first
    ``num_train_timesteps`` of the shuffle: a random subset per trajectory."""
    std_mode: Literal["group", "global", "none"] = "group"
    """DDPO divides by each prompt's own std (its buffer's, or the batch's while the buffer is
    short): ``group`` only; ``stat_buffer_size=0`` gives the batch's std."""
    std_eps: float = 1e-6
    """Added to the std of the baseline (DDPO's ``PerPromptStatTracker``: 1e-6)."""
    stat_buffer_size: int = 16
    """Rewards kept per prompt for its baseline (DDPO ``per_prompt_stat_tracking.buffer_size``:
    16; a deque of the last rewards, whichever iterations they came from). 0 disables per-prompt
    tracking: advantages are the batch's standardised rewards."""
    stat_min_count: int = 16
    """Below this many buffered rewards a prompt is normalised by the whole batch's mean and
    std (DDPO ``per_prompt_stat_tracking.min_count``: 16)."""

    def validate_ddpo(self, train_config: Any = None) -> None:
        validate_ddim_objective(self, "ddpo")
        if self.stat_buffer_size < 0 or self.stat_min_count < 0:
            raise ConfigError("algorithm.stat_buffer_size and stat_min_count must be >= 0")
        if self.stat_buffer_size and self.stat_min_count > self.stat_buffer_size:
            raise ConfigError(
                f"algorithm.stat_min_count={self.stat_min_count} exceeds stat_buffer_size="
                f"{self.stat_buffer_size}: no prompt would ever use its own statistics"
            )
        ignored = {
            "std_mode": (self.std_mode, "group"),
            "stat_history": (self.stat_history, 1),
            "advantage": (self.advantage, "group"),
            "std_estimator": (self.std_estimator, "population"),
        }
        for key, (value, default) in ignored.items():
            if value != default:
                raise ConfigError(
                    f"algorithm.{key}={value!r}: ddpo's baseline is its own stat tracker "
                    "(stat_buffer_size, stat_min_count, std_eps); use ddim_grpo for Flow-GRPO's"
                )
