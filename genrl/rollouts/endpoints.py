"""Endpoint rollouts: clean samples ``x_0`` of the deterministic ODE and nothing else (the
rollout of the regression objectives: RAM, GDRO, DiffusionNFT).

No sampling step is ever scored, so any sampler would do; the ODE of ``sampler.num_steps`` steps
with ``sampler.guidance_scale`` is used. Algorithms with a lagged copy of the policy (RAM,
DiffusionNFT) sample from it: before each iteration's sampling the copy takes one EMA step
towards the current weights, ``old <- d old + (1 - d) theta`` with a scheduled decay ``d``; AWM keeps such a copy for a
KL term only and samples from the current weights (``sample_with_lagged=False``). Clean
samples read from an offline store become a rollout through ``from_samples``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from genrl.data.batches import FlowEndpoints
from genrl.data.rng import RolloutNoise, Streams
from genrl.policies.ema import EMA
from genrl.policies.protocols import FlowPolicy
from genrl.rollouts.base import Chunk, ChunkStream, chunk_rows
from genrl.rollouts.configs import LaggedCopyConfig
from genrl.rollouts.flow import FlowRollout
from samplers import FlowODESampler


class EndpointRollout(FlowRollout[FlowEndpoints]):
    """ODE endpoints of the policy, or of its lagged copy when ``lagged`` is given.

    Args:
        train_config: the run's config (``sampler``, ``train``, ``eval``).
        policy: the flow policy (its noise schedule and trainable network).
        lagged: the lagged copy's schedule; None keeps no copy.
        sample_with_lagged: the copy samples the endpoints (False: the current weights do, and
            the copy only serves the objective, through ``lagged_weights``).
    """

    def __init__(
        self,
        train_config: Any,
        policy: FlowPolicy,
        lagged: LaggedCopyConfig | None,
        sample_with_lagged: bool = True,
    ) -> None:
        super().__init__(train_config)
        s = train_config.sampler
        self.ode = FlowODESampler(policy.sigma_schedule(s.num_steps, s.shift))
        self.lagged_config = lagged
        self.sample_with_lagged = sample_with_lagged
        self._network = policy.network
        self._lagged: EMA | None = None
        self._lagged_state: dict[str, torch.Tensor] | None = None
        self.lagged_iteration = -1  # the last iteration whose EMA step was taken

    @property
    def lagged(self) -> EMA | None:
        """The lagged copy (None without one). Built on first use, after the trainer has moved
        the network to its device, so the copy lives next to the weights."""
        if self.lagged_config is None:
            return None
        if self._lagged is None:
            self._lagged = EMA(self._network, self.lagged_config.sampling_ema_decay)
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

    def _sampling_weights(self) -> contextlib.AbstractContextManager[None]:
        """The weights that sample: the lagged copy's, unless ``sample_with_lagged`` is off."""
        return self.lagged_weights() if self.sample_with_lagged else contextlib.nullcontext()

    @torch.no_grad()
    def collect(
        self, policy: FlowPolicy, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> FlowEndpoints:
        """Deterministic ODE samples (``sampler.num_steps``, ``sampler.guidance_scale``) from
        the lagged copy when there is one (and ``sample_with_lagged``): first the copy takes its
        EMA step towards the current weights, then it samples."""
        x, condition = self._begin(policy, prompts, noise)
        with self._sampling_weights():
            samples = torch.cat([chunk for _, chunk in self._ode(policy, x, condition)])
        return self.from_samples(prompts, group_ids, condition, samples)

    def chunks(self, num_samples: int) -> list[slice]:
        """Chunks of ``train.rollout_batch_size`` samples."""
        return chunk_rows(num_samples, self.train_config.train.rollout_batch_size)

    def stream(
        self, policy: FlowPolicy, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> ChunkStream[FlowEndpoints]:
        """``collect``, yielding each chunk of ``train.rollout_batch_size`` endpoints as soon
        as its ODE ends (``collect`` samples the same chunks in the same order). The lagged
        copy's weights are swapped in only while a chunk samples."""
        with torch.no_grad():
            x, condition = self._begin(policy, prompts, noise)
        chunks, samples = self._ode(policy, x, condition), []
        while True:
            with torch.no_grad(), self._sampling_weights():
                item = next(chunks, None)
            if item is None:
                break
            rows, chunk = item
            samples.append(chunk)
            yield Chunk(
                rows,
                self.from_samples(prompts[rows], group_ids[rows], _rows(condition, rows), chunk),
            )
        return self.from_samples(prompts, group_ids, condition, torch.cat(samples))

    def _begin(
        self, policy: FlowPolicy, prompts: list[str], noise: RolloutNoise
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The initial noise and prompt encodings; the lagged copy's EMA step, once per
        iteration: not again for a dynamic-sampling refill round, nor when a run resumes the
        iteration it stopped in."""
        x = noise.randn(Streams.INITIAL_NOISE, tuple(policy.latent_shape), policy.device)
        condition = policy.encode_prompts(prompts)
        lagged = self.lagged
        if lagged is not None and noise.iteration > self.lagged_iteration:
            assert self.lagged_config is not None
            lagged.decay = self.lagged_config.lagged_decay(noise.iteration)
            lagged.step(0)
            self.lagged_iteration = noise.iteration
        return x, condition

    def _ode(
        self, policy: FlowPolicy, x: torch.Tensor, condition: dict[str, torch.Tensor]
    ) -> Iterator[tuple[slice, torch.Tensor]]:
        """The ODE endpoints, ``train.rollout_batch_size`` rows at a time, with their rows."""
        guidance = self.train_config.sampler.guidance_scale
        sigmas = self.ode.sigmas.to(x.device)
        for rows in self.chunks(len(x)):
            xs, cond = x[rows], _rows(condition, rows)
            for i in range(self.ode.num_steps):
                v = policy.velocity(xs, sigmas[i].expand(len(xs)), cond, guidance)
                xs = self.ode.step(v, i, xs).prev_sample
            yield rows, xs

    def from_stored(
        self, policy: FlowPolicy, prompts: list[str], group_ids: torch.Tensor, samples: torch.Tensor
    ) -> FlowEndpoints:
        """Clean samples read from an offline store, with their prompts encoded."""
        condition = policy.encode_prompts(prompts)
        device = policy.device
        return self.from_samples(prompts, group_ids.to(device), condition, samples.to(device))

    def describe(self) -> dict[str, Any]:
        """The deterministic ODE and its settings (the store's ``sampler`` record)."""
        s = self.train_config.sampler
        return {
            "rollout": type(self).__name__,
            "sampler": "ode",
            "num_steps": s.num_steps,
            "shift": s.shift,
            "guidance_scale": s.guidance_scale,
        }

    def from_samples(
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

    def state_dict(self) -> dict[str, Any]:
        lagged = self.lagged
        if lagged is None:
            return {}
        return {"lagged": lagged.state_dict(), "lagged_iteration": self.lagged_iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.lagged_config is None:
            return
        self.lagged_iteration = int(state.get("lagged_iteration", -1))
        if self._lagged is not None:
            self._lagged.load_state_dict(state["lagged"])
        else:  # applied when the copy is built
            self._lagged_state = state["lagged"]


def _rows(condition: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    return {k: v[rows] for k, v in condition.items()}


__all__ = ["EndpointRollout", "LaggedCopyConfig"]
