"""AWM: Advantage Weighted Matching (Xue, Ge, Zhang, Li, Ma, arXiv 2509.25050) on noised
endpoints: the advantage-weighted flow-matching loss (``AdvantageWeightedMatchingLoss``) and its
objective (``AWMObjective``). The algorithm (``genrl/algorithms/awm.py``) pairs it with the
endpoint rollout; ``docs/algorithms/awm.md`` cites the released code line by line.

AWM keeps the pretraining loss and changes only its weights: each clean sample's flow-matching
error at a fresh noising is weighted by the sample's advantage, so samples better than their
group's mean are fitted and worse ones pushed away. With the per-sample error
``e = mean_dims (u - v)^2`` (``u = eps - x_0``) as a negative log-likelihood, the released code's
policy term is the policy gradient ``-A grad log p`` with ``log p = -g(e, t)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from genrl.data.batches import FlowEndpoints, NoisedEndpoints
from genrl.data.rng import RolloutNoise, Streams
from genrl.objectives.advantages import PerPromptStatTracker, clip_advantages
from genrl.objectives.base import StepContext
from genrl.objectives.losses import Metrics
from genrl.objectives.regression import EndpointRegression, unit_velocity
from genrl.objectives.regression_configs import AWMObjectiveConfig, Weighting
from genrl.objectives.regression_losses import per_sample_mean
from genrl.policies.protocols import FlowPolicy

# The released code adds this inside the power so that its gradient stays finite at e = 0.
GHUBER_OFFSET = 1e-10


def weighted_error(
    error: torch.Tensor, times: torch.Tensor, weighting: Weighting, power: float
) -> torch.Tensor:
    """``g(e, t)``, the per-unit loss that AWM treats as ``-log p``.

    ``uniform``: ``e``; ``t``: ``t e``; ``ghuber`` (the released default): the generalised
    Huber ``t ((e + d)^p - d^p) / p`` with ``d = 1e-10``, which equals ``t e`` at ``p = 1`` and
    shrinks the weight of large errors (``d g / d e = t (e + d)^(p - 1)``) for ``p < 1``.
    """
    if weighting == "uniform":
        return error
    if weighting == "t":
        return times * error
    if weighting == "ghuber":
        offset = torch.tensor(GHUBER_OFFSET, dtype=error.dtype, device=error.device)
        return times * ((error + offset) ** power - offset**power) / power
    raise ValueError(f"unknown weighting {weighting!r}")


@dataclass
class AdvantageWeightedMatchingLoss:
    """AWM's loss (arXiv 2509.25050; the released ``train_sd3_awm.py``, ``compute_log_prob_awm``
    and its training step).

    Per unit (one clean sample at one noising ``x_t = (1 - t) x_0 + t eps``):
    ``e = mean_dims (u - v)^2`` with ``u = eps - x_0`` and ``g = g(e, t)`` (``weighted_error``).
    The released code forms ``ratio = exp(-g - stopgrad(-g))`` (always 1: it is on-policy) and
    trains ``mean(-A * ratio)``, whose value is ``-mean(A)`` and whose gradient is that of

    ``L = mean_units A * g  +  beta * mean (v - v_ref)^2  +  lagged_beta * mean (v - v_lag)^2``

    which is what this returns (its value says how well the weighted fit goes; the reference's
    value carries no information). ``v_ref`` is the frozen model, ``v_lag`` the lagged EMA copy;
    both terms are dropped when their weight is 0 or their velocity is None.

    Args:
        weighting: ``g`` above (released: ``ghuber``).
        power: the generalised Huber power ``p`` (released ``ghuber_power``: 0.25).
        beta: weight of the KL to the frozen model (released ``train.beta``: 0.001 GenEval, 0.003
            OCR, 1e-4 PickScore).
        lagged_beta: weight of the KL to the lagged copy (released ``ema_beta``: 1).

    Shapes: velocities and ``target_velocity`` ``[U, *event]``; ``advantages`` and ``times``
    ``[U]``.
    """

    weighting: Weighting = "ghuber"
    power: float = 0.25
    beta: float = 0.0
    lagged_beta: float = 0.0

    def __call__(
        self,
        velocity: torch.Tensor,
        target_velocity: torch.Tensor,
        advantages: torch.Tensor,
        times: torch.Tensor,
        reference_velocity: torch.Tensor | None = None,
        lagged_velocity: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Metrics]:
        # Double precision as in the released code: (e + 1e-10)^0.25 needs it near e = 0.
        error = per_sample_mean((velocity.double() - target_velocity.double()) ** 2)  # [U]
        weighted = weighted_error(error, times.double(), self.weighting, self.power)
        policy_loss = (advantages.double() * weighted).mean().float()
        loss = policy_loss
        metrics: Metrics = {
            "policy_loss": policy_loss.detach(),
            "flow_matching_error": error.detach().mean().float(),
            "weighted_error": weighted.detach().mean().float(),
            "advantage_abs_mean": advantages.detach().abs().mean(),
        }
        for name, other, weight in (
            ("kl", reference_velocity, self.beta),
            ("lagged_kl", lagged_velocity, self.lagged_beta),
        ):
            if other is None or weight <= 0:
                continue
            kl = per_sample_mean((velocity - other.detach()) ** 2).mean()
            metrics[name] = kl.detach()
            loss = loss + weight * kl
        return loss, metrics


def stratified_level_indices(
    uniform: torch.Tensor, num_steps: int, fraction: float, skip_first: bool
) -> torch.Tensor:
    """Sampler-level indices, one per stratum, as the released code draws them: strata bounded
    by ``linspace(first, int(fraction * num_steps), k + 1)`` truncated to integers, the ``j``-th
    of a sample's ``k`` noisings uniform in the ``j``-th stratum (a stratum of width 0 gives its
    lower bound). ``uniform`` is ``[n, k]`` in [0, 1); returns ``[n, k]`` indices."""
    k = uniform.shape[1]
    first = 1 if skip_first else 0
    last = max(int(num_steps * fraction), first + 1)
    bounds = torch.linspace(first, last, k + 1).long()
    lower, upper = bounds[:-1], bounds[1:]
    return lower + (uniform * (upper - lower)).long()


class AWMObjective(EndpointRegression):
    """AWM's advantage-weighted flow-matching loss (``AdvantageWeightedMatchingLoss``), one unit
    per sample and noising, each with its own ``eps`` (released: fresh noise per sample and
    timestep)."""

    def __init__(self, config: AWMObjectiveConfig, rollout: Any, group_size: int) -> None:
        super().__init__(config, rollout, group_size)
        self.config = config
        self.tracker = PerPromptStatTracker(config.std_mode, 1)
        self.loss_fn = AdvantageWeightedMatchingLoss(
            config.weighting, config.ghuber_power, config.beta, config.lagged_beta
        )

    @property
    def uses_reference(self) -> bool:
        return self.config.beta > 0

    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        """Per-prompt ``(r - mean) / (std + 1e-4)``, clipped to +-``advantage_clip`` and scaled
        to +-``advantage_max`` (the released code does both at the loss; they are used nowhere
        else)."""
        del group_ids, inputs
        c = self.config
        clipped = clip_advantages(self.tracker.update(prompts, rewards), c.advantage_clip)
        return clipped / c.advantage_clip * c.advantage_max

    def units(
        self, policy: FlowPolicy, batch: FlowEndpoints, noise: RolloutNoise
    ) -> NoisedEndpoints:
        units = super().units(policy, batch, noise)
        c = self.config
        if c.time_sampling == "sampler_steps":  # stratified, from the same uniform draws
            uniform = noise.rand(Streams.NOISING_TIME, (c.noisings_per_sample,))
            levels = self.rollout.ode.sigmas
            index = stratified_level_indices(
                uniform, self.rollout.ode.num_steps, c.level_fraction, c.skip_first_level
            )
            units.sigma = levels[index.reshape(-1)].to(units.sigma)
        return units

    def loss(
        self, policy: FlowPolicy, minibatch: NoisedEndpoints, step: StepContext | None = None
    ) -> tuple[torch.Tensor, Metrics]:
        del step
        c, mb = self.config, minibatch
        target = (mb.noise - mb.clean).flatten(0, 1)  # one member per unit
        reference = lagged = None
        with torch.no_grad():
            if self.uses_reference:
                with policy.reference():
                    reference = unit_velocity(policy, mb).flatten(0, 1)
            if c.lagged_beta > 0:
                with self.rollout.lagged_weights():
                    lagged = unit_velocity(policy, mb).flatten(0, 1)
        velocity = unit_velocity(policy, mb).flatten(0, 1)
        advantages = mb.advantages.reshape(-1)
        return self.loss_fn(velocity, target, advantages, mb.sigma, reference, lagged)


__all__ = [
    "AWMObjective",
    "AWMObjectiveConfig",
    "AdvantageWeightedMatchingLoss",
    "stratified_level_indices",
    "weighted_error",
]
