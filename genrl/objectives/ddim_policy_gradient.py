"""Step-wise policy gradients on DDIM trajectories of a diffusion model: Flow-GRPO's objective
(``ddim_grpo``) and DDPO's (``ddpo``).

Both train the PPO-clipped ratio of each trained transition ``x_t -> x_prev`` re-scored under
the current model (``genrl/objectives/flow_steps.py``; for DDPO, Black et al. 2023, its
importance-sampling estimator with PPO's clipping):

    L = mean_{i, t} max(-A_i r_{i,t}, -A_i clip(r_{i,t}, 1 - eps, 1 + eps)),
    r_{i,t} = p_theta(x_prev | x_t, c) / p_old(x_prev | x_t, c),

with the DDIM step's Gaussian as the policy (``samplers/ddim.py``). Only the model call differs
from the flow case: the prediction at the transition's timestep instead of the velocity at its
noise level (``DiffusionStepLoss``). DDPO's advantages come from its own per-prompt stat tracker
(``DDPOStatTracker``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from genrl.data.batches import FlowTransitions
from genrl.objectives.advantages import clip_advantages
from genrl.objectives.diffusion_configs import DDPOObjectiveConfig
from genrl.objectives.flow_policy_gradient import FlowPolicyGradient
from genrl.objectives.flow_steps import FlowStepLoss
from genrl.policies.protocols import DiffusionPolicy


class DiffusionStepLoss(FlowStepLoss):
    """The flow-step loss with a diffusion model's prediction at each unit's timestep
    (``rollout.sampler.timesteps[timestep_index]``)."""

    def model_output(self, policy: Any, mb: FlowTransitions) -> torch.Tensor:
        diffusion: DiffusionPolicy = policy
        timesteps = self.rollout.sampler.timesteps.to(mb.sample.device)
        return diffusion.predict(
            mb.sample, timesteps[mb.timestep_index], mb.condition, self.guidance
        )


class DDIMPolicyGradient(FlowPolicyGradient):
    """Flow-GRPO's objective (per-prompt advantages, clipped step ratios, KL on the step
    means) over a ``DDIMRollout``'s trajectories."""

    step_loss_class = DiffusionStepLoss


class DDPOStatTracker:
    """DDPO's per-prompt baseline (``ddpo_pytorch/stat_tracking.py``): each prompt keeps a
    buffer of its last ``buffer_size`` rewards (this batch's appended first); while it holds
    fewer than ``min_count``, the prompt's rewards are standardised by the whole batch's mean and
    std, afterwards by the buffer's (population std, plus ``eps``). ``buffer_size = 0``:
    the batch's statistics for every prompt.
    """

    def __init__(self, buffer_size: int = 16, min_count: int = 16, eps: float = 1e-6) -> None:
        self.buffer_size = buffer_size
        self.min_count = min_count
        self.eps = eps
        self.buffers: dict[str, deque[float]] = {}

    def update(self, prompts: list[str], rewards: torch.Tensor) -> torch.Tensor:
        """``[N]`` advantages of the gathered batch, then its rewards are remembered."""
        rewards = rewards.float()
        if rewards.ndim != 1 or len(prompts) != len(rewards):
            raise ValueError(f"{len(prompts)} prompts need [N] rewards, got {tuple(rewards.shape)}")
        batch_mean, batch_std = rewards.mean(), rewards.std(unbiased=False) + self.eps
        if self.buffer_size == 0:
            return (rewards - batch_mean) / batch_std
        advantages = torch.empty_like(rewards)
        for prompt in dict.fromkeys(prompts):
            rows = torch.tensor([p == prompt for p in prompts])
            buffer = self.buffers.setdefault(prompt, deque(maxlen=self.buffer_size))
            buffer.extend(rewards[rows].tolist())
            if len(buffer) < self.min_count:
                mean, std = batch_mean, batch_std
            else:
                kept = torch.tensor(list(buffer))
                mean, std = kept.mean(), kept.std(unbiased=False) + self.eps
            advantages[rows] = (rewards[rows] - mean) / std
        return advantages

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": {prompt: list(values) for prompt, values in self.buffers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffers = {
            prompt: deque(values, maxlen=self.buffer_size)
            for prompt, values in state["buffers"].items()
        }


class DDPOObjective(DDIMPolicyGradient):
    """DDPO's PPO objective: ``DDPOStatTracker`` advantages clipped to ``+-advantage_clip``, the
    clipped step ratios of ``timestep_fraction`` of each trajectory's steps, no KL."""

    config: DDPOObjectiveConfig

    def __init__(self, config: DDPOObjectiveConfig, rollout: Any, minibatch_size: int) -> None:
        super().__init__(config, rollout, minibatch_size)
        self.ddpo_tracker = DDPOStatTracker(
            config.stat_buffer_size, config.stat_min_count, config.std_eps
        )

    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        del group_ids, inputs
        return clip_advantages(
            self.ddpo_tracker.update(prompts, rewards), self.config.advantage_clip
        )

    def excluded_samples(
        self, rewards: torch.Tensor, group_ids: torch.Tensor
    ) -> torch.Tensor | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"ddpo_tracker": self.ddpo_tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ddpo_tracker.load_state_dict(state["ddpo_tracker"])


__all__ = ["DDIMPolicyGradient", "DDPOObjective", "DDPOStatTracker", "DiffusionStepLoss"]
