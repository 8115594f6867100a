"""Flow-GRPO's objective (Liu et al. 2025): per-prompt advantages of whole trajectories, and the
clipped surrogate of each trained stochastic step (``genrl/objectives/flow_steps.py``).

Advantages (eq. 4) are the rewards normalised per prompt text, Flow-GRPO's stat tracker; with
``kl_reward`` each step has its own reward ``r - kl_reward * kl_t`` (the KL measured while
sampling) and its own column of advantages. A trajectory trains ``timestep_fraction`` of its
stochastic steps (the first ones, as the reference, or a random subset), or every step of an SDE
window; trajectories whose advantages are all zero are left out (``drop_zero_advantages``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from genrl.data.batches import FlowTrajectory, FlowTransitions, SharedRows
from genrl.data.rng import RolloutNoise, Streams
from genrl.objectives.advantages import (
    PerPromptStatTracker,
    clip_advantages,
    median_centered_advantages,
)
from genrl.objectives.base import Objective, StepContext
from genrl.objectives.flow_configs import FlowPolicyGradientConfig
from genrl.objectives.flow_steps import FlowStepLoss
from genrl.objectives.losses import Metrics
from genrl.policies.protocols import FlowPolicy


class FlowPolicyGradient(Objective[FlowPolicy, FlowTrajectory, FlowTransitions]):
    """Flow-GRPO's objective over a ``FlowSDERollout``'s trajectories.

    Args:
        config: the objective's fields.
        rollout: the rollout (its window and samplers; ``rescore``).
        minibatch_size: units per minibatch (how many trajectories dropping may leave).
    """

    step_loss_class: ClassVar[type[FlowStepLoss]] = FlowStepLoss
    """The loss of one step (``DiffusionStepLoss`` for DDIM trajectories of a diffusion
    model)."""

    def __init__(self, config: FlowPolicyGradientConfig, rollout: Any, minibatch_size: int) -> None:
        self.config = config
        self.rollout = rollout
        self.minibatch_size = minibatch_size
        self.tracker = PerPromptStatTracker(
            config.std_mode, config.stat_history, config.std_eps, config.std_estimator
        )
        self.step_loss = self.step_loss_class(config, rollout, rollout.guidance_scale)

    @property
    def uses_reference(self) -> bool:
        return self.config.kl_beta > 0

    @property
    def num_train_steps(self) -> int:
        """Steps trained per trajectory: ``timestep_fraction`` of its stochastic steps, or every
        step of an SDE window (Flow-GRPO-Fast and MixGRPO train the whole window)."""
        trainable = self.rollout.trainable_per_trajectory
        if self.rollout.window_size:
            return trainable
        return max(1, int(trainable * self.config.timestep_fraction))

    def num_units(self, num_samples: int) -> int:
        return num_samples * self.num_train_steps

    def advantage_inputs(self, batch: FlowTrajectory) -> dict[str, torch.Tensor]:
        """The per-step KL measured while sampling, when ``kl_reward`` uses it."""
        if self.config.kl_reward > 0 and batch.step_kl is not None:
            return {"step_kl": batch.step_kl}
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
        if self.config.advantage == "median":
            advantages, _ = median_centered_advantages(rewards, group_ids, self.config.mad_eps)
            return clip_advantages(advantages, self.config.advantage_clip)
        # Groups are keyed by prompt text, as in Flow-GRPO's stat tracker.
        if "step_kl" in inputs:
            rewards = rewards[:, None] - self.config.kl_reward * inputs["step_kl"].to(rewards)
        return clip_advantages(self.tracker.update(prompts, rewards), self.config.advantage_clip)

    def excluded_samples(
        self, rewards: torch.Tensor, group_ids: torch.Tensor
    ) -> torch.Tensor | None:
        """MC-GRPO's pivots (``advantage=median``): one median sample per group."""
        if self.config.advantage != "median":
            return None
        return median_centered_advantages(rewards, group_ids, self.config.mad_eps)[1]

    def units(
        self, policy: FlowPolicy, batch: FlowTrajectory, noise: RolloutNoise
    ) -> FlowTransitions:
        """Pick ``num_train_steps`` trainable steps per trajectory and flatten them (without the
        trajectories whose advantages are all zero, with ``drop_zero_advantages``)."""
        del policy
        n, num_steps = batch.log_probs.shape
        k = self.num_train_steps
        # Keys of non-trainable steps are pushed past every trainable one so they are never picked.
        device = batch.latents.device
        if self.config.timestep_selection == "random":
            keys = noise.rand(Streams.STEP_SELECTION, (num_steps,)).to(device)
        else:  # prefix: sampling order, first trainable steps first
            keys = torch.arange(num_steps, device=device, dtype=torch.float32).expand(n, -1)
        keys = keys + num_steps * (~batch.trainable_steps).float()
        available = int(batch.trainable_steps.sum(dim=1).min()) if n else k
        if available < k:
            raise ValueError(
                f"a trajectory has {available} trainable steps but {k} are to be trained per "
                "trajectory (the rollout's window and the sampler disagree)"
            )
        steps = keys.argsort(dim=1)[:, :k]  # [n, k]
        rows = torch.arange(n, device=device).unsqueeze(1).expand(n, k)
        advantages = batch.advantages
        if advantages.ndim == 2:
            advantages = advantages.gather(1, steps)  # [n, k]
        else:
            advantages = advantages[:, None].expand(n, k)
        if self.config.drop_zero_advantages:
            kept = self._rows_to_train(advantages, noise)
            rows, steps, advantages = rows[kept], steps[kept], advantages[kept]
        flat_rows, flat_steps = rows.reshape(-1), steps.reshape(-1)
        means = batch.means
        return FlowTransitions(
            rows=flat_rows,
            conditions=SharedRows(batch.condition),
            sample=batch.latents[flat_rows, flat_steps],
            next_sample=batch.latents[flat_rows, flat_steps + 1],
            timestep_index=flat_steps,
            old_log_probs=batch.log_probs[flat_rows, flat_steps],
            advantages=advantages.reshape(-1),
            old_means=None if means is None else means[flat_rows, flat_steps],
        )

    def _rows_to_train(self, advantages: torch.Tensor, noise: RolloutNoise) -> torch.Tensor:
        """Trajectories with a non-zero advantage; when fewer remain than the iteration's planned
        minibatches need, zero-advantage ones chosen at random fill up (Flow-GRPO likewise adds
        random ones back so that its batches divide evenly)."""
        nonzero = (advantages != 0).any(dim=1)
        n, k = advantages.shape
        minibatches = math.ceil(n * k / self.minibatch_size)
        needed = min(n, math.ceil(minibatches / k))
        missing = needed - int(nonzero.sum())
        if missing > 0:
            zero_rows = (~nonzero).nonzero()[:, 0]
            order = noise.local_permutation(Streams.DROP_REFILL, len(zero_rows))
            nonzero[zero_rows[order.to(zero_rows.device)[:missing]]] = True
        return nonzero.nonzero()[:, 0]

    def loss(
        self, policy: FlowPolicy, minibatch: FlowTransitions, step: StepContext | None = None
    ) -> tuple[torch.Tensor, Metrics]:
        del step
        return self.step_loss(policy, minibatch)

    def state_dict(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state["tracker"])


__all__ = ["FlowPolicyGradient", "FlowPolicyGradientConfig"]
