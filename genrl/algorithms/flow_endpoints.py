"""Shared machinery of the regression objectives for flow models (RAM, GDRO, DiffusionNFT).

These objectives never score a sampling step. A rollout is only clean endpoints ``x_0`` drawn
with the deterministic ODE (any sampler would do: nothing about it enters the loss) and their
rewards. Training noises each endpoint as in pretraining, ``x_t = (1 - t) x_0 + t eps`` with
velocity target ``eps - x_0``, at ``noisings_per_sample`` draws of ``(t, eps)``, and regresses.
This file holds the common parts: the config fields, ODE collection (optionally from a lagged
copy of the policy), noising, and the lagged copy itself.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from genrl.algorithms.base import Algorithm, AlgorithmConfig, RolloutNoise
from genrl.algorithms.flow_rollout import decode_in_chunks
from genrl.ema import EMA
from genrl.overrides import ConfigError
from genrl.rollout import FlowEndpoints, NoisedEndpoints, SharedRows
from samplers import FlowODESampler

# RolloutNoise stream tags: initial noise 0 (as the flow rollouts), training noise below.
TIME_TAG = 30_000
EPS_TAG = 31_000


@dataclass
class EndpointConfig(AlgorithmConfig):
    """Fields shared by the regression objectives (each algorithm documents its defaults)."""

    noisings_per_sample: int = 4
    """Draws of ``(t, eps)`` per clean sample (RAM's K); each is one training unit (one unit
    per group and draw for group losses)."""
    time_sampling: Literal["uniform", "linear", "logit_normal", "sampler_steps"] = "uniform"
    """Density of ``t`` on ``(time_min, time_max)``: uniform; ``linear``, density proportional to
    ``t`` (more weight near noise; RAM); ``logit_normal``, ``sigmoid(N(0, 1))`` (SD3's
    pretraining); ``sampler_steps``, uniform over the sampler's noise levels ``sigma_0 ..
    sigma_{T-1}`` (DiffusionNFT's released code; the range is ignored)."""
    time_min: float = 0.02
    """Smallest ``t``: at ``t -> 0`` the state is the clean sample and the regression is
    ill-conditioned for ``x_0``-space losses."""
    time_max: float = 0.98
    """Largest ``t``."""
    sampling_ema_decay: float = 0.0
    """For algorithms with a lagged copy of the policy (RAM, DiffusionNFT), which draws the
    endpoints: ``old <- d old + (1 - d) theta`` before each iteration's sampling, with
    ``d = min(sampling_ema_ramp * iteration, sampling_ema_decay)`` (0: the copy is the policy as
    it was before the iteration's updates)."""
    sampling_ema_ramp: float = 0.0
    """Per-iteration growth of the lagged copy's decay (0: constant ``sampling_ema_decay``)."""
    sampling_ema_delay: int = 0
    """Iterations with decay 0 before the ramp starts (DiffusionNFT's OCR setting: 75)."""

    def validate(self, train_config: Any = None) -> None:
        if self.noisings_per_sample < 1:
            raise ConfigError(
                f"algorithm.noisings_per_sample must be >= 1, got {self.noisings_per_sample}"
            )
        if not 0 <= self.time_min < self.time_max <= 1:
            raise ConfigError(
                "need 0 <= algorithm.time_min < algorithm.time_max <= 1, got "
                f"{self.time_min} and {self.time_max}"
            )
        if not 0 <= self.sampling_ema_decay < 1:
            raise ConfigError(
                f"algorithm.sampling_ema_decay must lie in [0, 1), got {self.sampling_ema_decay}"
            )
        if self.sampling_ema_ramp < 0 or self.sampling_ema_delay < 0:
            raise ConfigError("algorithm.sampling_ema_ramp and sampling_ema_delay must be >= 0")

    def lagged_decay(self, iteration: int) -> float:
        """The lagged copy's decay at ``iteration``."""
        if iteration < self.sampling_ema_delay:
            return 0.0
        if self.sampling_ema_ramp == 0:
            return self.sampling_ema_decay
        ramped = self.sampling_ema_ramp * (iteration - self.sampling_ema_delay)
        return min(ramped, self.sampling_ema_decay)


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


class EndpointAlgorithm(Algorithm):
    """Base of the regression objectives: collect, decode, noise; subclasses give advantages
    and the loss. ``group_units`` (GDRO) makes one unit per group and draw, whose members share
    ``t`` and ``eps``; otherwise one unit per sample and draw."""

    config: EndpointConfig
    group_units: ClassVar[bool] = False
    uses_lagged_copy: ClassVar[bool] = False

    def __init__(self, config: EndpointConfig, train_config: Any) -> None:
        super().__init__(config, train_config)
        self.ode: FlowODESampler | None = None
        self._network: Any = None
        self._lagged: EMA | None = None
        self._lagged_state: dict[str, torch.Tensor] | None = None
        self.lagged_iteration = -1  # the last iteration whose EMA step was taken
        self.tracker: Any = None  # per-prompt reward statistics, for algorithms that keep them

    def setup(self, policy: Any) -> None:
        s = self.train_config.sampler
        self.ode = FlowODESampler(policy.sigma_schedule(s.num_steps, s.shift))
        self._network = policy.network

    @property
    def lagged(self) -> EMA | None:
        """The lagged copy (None for algorithms without one). Built on first use, after the
        trainer has moved the network to its device, so the copy lives next to the weights."""
        if not self.uses_lagged_copy or self._network is None:
            return None
        if self._lagged is None:
            self._lagged = EMA(self._network, self.config.sampling_ema_decay)
            if self._lagged_state is not None:
                self._lagged.load_state_dict(self._lagged_state)
                self._lagged_state = None
        return self._lagged

    @contextlib.contextmanager
    def lagged_weights(self) -> Iterator[None]:
        """Inside, the policy's trainable weights are the lagged copy's (no-op without one)."""
        lagged = self.lagged
        if lagged is None:
            yield
            return
        with lagged.swapped_in():
            yield

    # -- phase 2 ---------------------------------------------------------------------------------
    @torch.no_grad()
    def collect(
        self, policy: Any, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> FlowEndpoints:
        """Deterministic ODE samples (``sampler.num_steps``, ``sampler.guidance_scale``) from
        the lagged copy when the algorithm keeps one: first the copy takes its EMA step towards
        the current weights (``old <- d old + (1 - d) theta``), then it samples."""
        if self.ode is None:
            self.setup(policy)
        assert self.ode is not None
        x = noise.randn(0, tuple(policy.latent_shape), policy.device)
        condition = policy.encode_prompts(prompts)
        lagged = self.lagged
        # Once per iteration: not again for a dynamic-sampling refill round, nor when a run
        # resumes the iteration it stopped in.
        if lagged is not None and noise.iteration > self.lagged_iteration:
            lagged.decay = self.config.lagged_decay(noise.iteration)
            lagged.step(0)
            self.lagged_iteration = noise.iteration
        with self.lagged_weights():
            samples = self._ode(policy, x, condition)
        return self.rollout_from_samples(prompts, group_ids, condition, samples)

    def _ode(
        self, policy: Any, x: torch.Tensor, condition: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        assert self.ode is not None
        guidance = self.train_config.sampler.guidance_scale
        size = self.train_config.train.rollout_batch_size or len(x)
        sigmas = self.ode.sigmas.to(x.device)
        chunks = []
        for start in range(0, len(x), size):
            xs = x[start : start + size]
            cond = {k: v[start : start + size] for k, v in condition.items()}
            for i in range(self.ode.num_steps):
                v = policy.velocity(xs, sigmas[i].expand(len(xs)), cond, guidance)
                xs = self.ode.step(v, i, xs).prev_sample
            chunks.append(xs)
        return torch.cat(chunks)

    def rollout_from_samples(
        self,
        prompts: list[str],
        group_ids: torch.Tensor,
        condition: dict[str, torch.Tensor],
        samples: torch.Tensor,
    ) -> FlowEndpoints:
        """Wrap clean samples (sampled now or read from an offline store) as a rollout."""
        return FlowEndpoints(
            prompts=list(prompts),
            group_ids=group_ids,
            condition=condition,
            samples=samples.float(),
            advantages=torch.zeros(len(samples), device=samples.device),
        )

    def final_outputs(self, policy: Any, rollout: FlowEndpoints) -> torch.Tensor:
        return decode_in_chunks(policy, rollout.final, self.train_config.train.rollout_batch_size)

    # -- units -----------------------------------------------------------------------------------
    def num_units(self, num_samples: int) -> int:
        k = self.config.noisings_per_sample
        if self.group_units:
            return num_samples // self.train_config.train.group_size * k
        return num_samples * k

    def training_units(self, rollout: FlowEndpoints, noise: RolloutNoise) -> NoisedEndpoints:
        """``noisings_per_sample`` draws of ``(t, eps)`` per sample (per group for group units),
        from the iteration's streams: the same draws on any number of processes."""
        c, device = self.config, rollout.samples.device
        n, event = len(rollout), tuple(rollout.samples.shape[1:])
        k = c.noisings_per_sample
        rows = torch.arange(n, device=device)
        uniform = noise.rand(TIME_TAG, (k,)).to(device)  # [n, k]
        eps = noise.randn_by_sample(EPS_TAG, (k, *event), device)  # [n, k, *event]
        if self.group_units:
            size = self.train_config.train.group_size
            if n % size or not bool(
                (rollout.group_ids.view(-1, size) == rollout.group_ids[::size, None]).all()
            ):
                raise ValueError(
                    f"{c.name} needs whole groups on each process: make "
                    "train.prompts_per_iteration divisible by the number of processes"
                )
            groups = n // size
            # Every member of a group takes its first member's draws.
            members = rows.view(groups, size)  # [g, M]
            first = members[:, 0]
            rows = members.unsqueeze(1).expand(groups, k, size).reshape(groups * k, size)
            sigma = uniform[first].reshape(-1)
            eps_units = eps[first].reshape(groups * k, 1, *event).expand(-1, size, *event)
        else:
            rows = rows.unsqueeze(1).expand(n, k).reshape(n * k, 1)
            sigma = uniform.reshape(-1)
            eps_units = eps.reshape(n * k, 1, *event)
        if c.time_sampling == "sampler_steps":
            assert self.ode is not None
            levels = self.ode.sigmas[:-1].to(device)
            sigma = levels[(sigma * len(levels)).long().clamp_max(len(levels) - 1)]
        else:
            sigma = sample_times(sigma, c.time_sampling, c.time_min, c.time_max)
        return NoisedEndpoints(
            rows=rows,
            conditions=SharedRows(rollout.condition),
            clean=rollout.samples[rows],
            noise=eps_units.contiguous(),
            sigma=sigma,
            advantages=rollout.advantages[rows],
        )

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.tracker is not None:
            state["tracker"] = self.tracker.state_dict()
        lagged = self.lagged
        if lagged is not None:
            state.update(lagged=lagged.state_dict(), lagged_iteration=self.lagged_iteration)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.tracker is not None:
            self.tracker.load_state_dict(state["tracker"])
        if not self.uses_lagged_copy:
            return
        self.lagged_iteration = int(state.get("lagged_iteration", -1))
        if self._lagged is not None:
            self._lagged.load_state_dict(state["lagged"])
        else:  # applied when the copy is built
            self._lagged_state = state["lagged"]


def unit_velocity(policy: Any, units: NoisedEndpoints, guidance_scale: float = 1.0) -> torch.Tensor:
    """``[U, M, *event]`` velocity of ``policy`` (current, or reference / lagged inside their
    contexts) at the units' noised states."""
    x = units.noised
    u, m = x.shape[:2]
    flat = x.reshape(u * m, *x.shape[2:])
    sigma = units.sigma.repeat_interleave(m)
    v = policy.velocity(flat, sigma, units.condition, guidance_scale)
    return v.float().reshape(x.shape)
