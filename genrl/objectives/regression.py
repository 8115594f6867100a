"""What the regression objectives share (RAM, GDRO, DiffusionNFT): training units that noise
clean samples as in pretraining.

These objectives never score a sampling step. Each clean sample ``x_0`` of an endpoint rollout is
noised at ``noisings_per_sample`` draws of ``(t, eps)``, ``x_t = (1 - t) x_0 + t eps`` with
velocity target ``eps - x_0``, and the loss regresses at those states. With ``group_units`` (GDRO)
one unit is a whole group at one draw shared by its members.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from genrl.data.batches import FlowEndpoints, NoisedEndpoints, SharedRows
from genrl.data.rng import RolloutNoise, Streams
from genrl.objectives.base import Objective
from genrl.objectives.regression_configs import NoisingConfig
from genrl.policies.protocols import FlowPolicy


def sample_times(
    uniform: torch.Tensor, kind: str, time_min: float, time_max: float
) -> torch.Tensor:
    """Map uniform numbers in [0, 1) to noise levels ``t`` with the chosen density.

    ``linear`` inverts the CDF of ``p(t) ~ t`` on ``[a, b]``: ``t = sqrt(a^2 + u (b^2 - a^2))``;
    ``logit_normal`` is ``sigmoid`` of a standard normal (by its inverse CDF) clamped to the range.
    """
    a, b = time_min, time_max
    if kind == "uniform":
        return a + uniform * (b - a)
    if kind == "linear":
        return torch.sqrt(a * a + uniform * (b * b - a * a))
    if kind == "logit_normal":
        u = uniform.clamp(1e-6, 1 - 1e-6)
        normal = math.sqrt(2) * torch.erfinv(2 * u - 1)
        return torch.sigmoid(normal).clamp(a, b)
    raise ValueError(f"unknown time_sampling {kind!r}")


class EndpointRegression(Objective[FlowPolicy, FlowEndpoints, NoisedEndpoints]):
    """Base of the regression objectives: units from noised endpoints; subclasses give the
    advantages and the loss.

    Args:
        config: the noising fields.
        rollout: the endpoint rollout (its sampler's levels; its lagged copy, where used).
        group_size: samples per group (``group_units``).
        group_units: one unit per group and draw, whose members share ``t`` and ``eps``.
        member_noise: with ``group_units``, the members still share ``t`` but each draws its own
            ``eps`` (``per_member_noise``; GDRO's and DGPO's ``share_noise=False``).
    """

    def __init__(
        self,
        config: NoisingConfig,
        rollout: Any,
        group_size: int,
        group_units: bool = False,
        member_noise: bool = False,
    ) -> None:
        self.noising = config
        self.rollout = rollout
        self.group_size = group_size
        self.group_units = group_units
        self.member_noise = member_noise
        self.tracker: Any = None  # per-prompt reward statistics, for objectives that keep them

    def num_units(self, num_samples: int) -> int:
        k = self.noising.noisings_per_sample
        if self.group_units:
            return num_samples // self.group_size * k
        return num_samples * k

    def units(
        self, policy: FlowPolicy, batch: FlowEndpoints, noise: RolloutNoise
    ) -> NoisedEndpoints:
        """``noisings_per_sample`` draws of ``(t, eps)`` per sample (per group for group units),
        from the iteration's streams: the same draws on any number of processes."""
        del policy
        c, device = self.noising, batch.samples.device
        n, event = len(batch), tuple(batch.samples.shape[1:])
        k = c.noisings_per_sample
        rows = torch.arange(n, device=device)
        uniform = noise.rand(Streams.NOISING_TIME, (k,)).to(device)  # [n, k]
        eps = noise.randn_by_sample(Streams.NOISING_EPS, (k, *event), device)  # [n, k, *event]
        if self.group_units:
            size = self.group_size
            if n % size or not bool(
                (batch.group_ids.view(-1, size) == batch.group_ids[::size, None]).all()
            ):
                raise ValueError(
                    "a group loss needs whole groups on each process: make "
                    "train.prompts_per_iteration divisible by the number of processes"
                )
            groups = n // size
            # Every member of a group takes its first member's draws.
            members = rows.view(groups, size)  # [g, M]
            first = members[:, 0]
            rows = members.unsqueeze(1).expand(groups, k, size).reshape(groups * k, size)
            sigma = uniform[first].reshape(-1)
            eps_units = eps[first].reshape(groups * k, 1, *event).expand(-1, size, *event)
            if self.member_noise:
                eps_units = per_member_noise(noise, batch, size, k)
        else:
            rows = rows.unsqueeze(1).expand(n, k).reshape(n * k, 1)
            sigma = uniform.reshape(-1)
            eps_units = eps.reshape(n * k, 1, *event)
        if c.time_sampling == "sampler_steps":
            levels = self.sampler_levels().to(device)
            sigma = levels[(sigma * len(levels)).long().clamp_max(len(levels) - 1)]
        else:
            sigma = sample_times(sigma, c.time_sampling, c.time_min, c.time_max)
        return NoisedEndpoints(
            rows=rows,
            conditions=SharedRows(batch.condition),
            clean=batch.samples[rows],
            noise=eps_units.contiguous(),
            sigma=sigma,
            advantages=batch.advantages[rows],
        )

    def sampler_levels(self) -> torch.Tensor:
        """The noise levels ``time_sampling="sampler_steps"`` draws from: every level the
        sampler starts a step at (objectives may keep a subset)."""
        return self.rollout.ode.sigmas[:-1]

    def state_dict(self) -> dict[str, Any]:
        return {} if self.tracker is None else {"tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.tracker is not None:
            self.tracker.load_state_dict(state["tracker"])


def per_member_noise(
    noise: RolloutNoise, batch: FlowEndpoints, group_size: int, noisings: int
) -> torch.Tensor:
    """One ``eps`` per member and noising, each sample's from its own stream (``MEMBER_EPS``),
    laid out as group units: ``[groups * noisings, group_size, *event]`` (GDRO and DGPO with
    ``share_noise=False``)."""
    eps = noise.randn_by_sample(
        Streams.MEMBER_EPS, (noisings, *batch.samples.shape[1:]), batch.samples.device
    )
    groups = len(batch) // group_size
    # eps[n, k] -> units [g * k, size]
    per_member = eps.view(groups, group_size, noisings, *eps.shape[2:]).transpose(1, 2)
    return per_member.reshape(groups * noisings, group_size, *eps.shape[2:]).contiguous()


def unit_velocity(
    policy: FlowPolicy, units: NoisedEndpoints, guidance_scale: float = 1.0
) -> torch.Tensor:
    """``[U, M, *event]`` velocity of ``policy`` (current, or reference / lagged inside their
    contexts) at the units' noised states."""
    x = units.noised
    u, m = x.shape[:2]
    flat = x.reshape(u * m, *x.shape[2:])
    sigma = units.sigma.repeat_interleave(m)
    v = policy.velocity(flat, sigma, units.condition, guidance_scale)
    return v.float().reshape(x.shape)


__all__ = ["EndpointRegression", "NoisingConfig", "sample_times", "unit_velocity"]
