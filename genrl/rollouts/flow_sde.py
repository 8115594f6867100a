"""Flow rollouts with a stochastic window (Flow-GRPO, Flow-GRPO-Fast, MixGRPO, DanceGRPO, CPS).

A trajectory of ``T`` steps runs the deterministic ODE outside a window of stochastic (SDE, CPS,
...) steps; with no window every step is stochastic (Flow-GRPO). When every sample of a group
starts from the same noise, the ODE steps before the window are identical within the group, so
they run once per group and the group branches at the window (Flow-GRPO-Fast). Every state and
stochastic step's log-prob is recorded, and ``rescore`` scores stored transitions under the
current velocity with the same sampler (bit for bit what sampling computed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from genrl.config.errors import ConfigError
from genrl.data.batches import FlowTrajectory, FlowTransitions
from genrl.data.rng import RolloutNoise, Streams
from genrl.objectives.losses import gaussian_mean_kl
from genrl.policies.protocols import FlowPolicy
from genrl.rollouts.base import Chunk, ChunkStream, chunk_rows
from genrl.rollouts.flow import FlowRollout
from samplers import SAMPLERS, FlowODESampler, GaussianFlowSampler, StepOutput
from samplers.windows import possible_window_starts, sde_window_mask, sde_window_start


@dataclass
class FlowSDERollout(FlowRollout[FlowTrajectory]):
    """The samplers and window settings of a flow rollout, built from ``config.sampler`` on the
    policy's own noise schedule (``from_config``)."""

    train_config: Any = field(repr=False)
    sde: GaussianFlowSampler
    ode: FlowODESampler
    guidance_scale: float
    window_size: int
    window_schedule: str
    window_range: list[int] | None
    window_stride: int
    window_shift_every: int
    window_shift_every_min: int
    window_wrap: bool
    same_initial_noise: bool
    num_groups: int
    batch_size: int = 0
    measure_kl: bool = False
    """Also evaluate the reference policy at every stochastic step and record the step's exact
    transition KL (Flow-GRPO's ``kl_reward``; one more forward per step)."""
    keep_means: bool = False
    """Record every step's transition mean (GRPO-Guard's ratio normalisation needs them)."""

    @property
    def uses_reference(self) -> bool:
        return self.measure_kl

    @classmethod
    def from_config(
        cls,
        train_config: Any,
        policy: FlowPolicy,
        *,
        measure_kl: bool = False,
        keep_means: bool = False,
    ) -> FlowSDERollout:
        """Samplers on ``policy``'s noise schedule with ``train_config.sampler``'s settings;
        refuses a setting whose trajectories would hold no stochastic step to train."""
        s = train_config.sampler
        sigmas = policy.sigma_schedule(s.num_steps, s.shift)
        sde = SAMPLERS[s.name](sigmas, s.noise_level, log_prob_reduction=s.log_prob_reduction)
        rollout = cls(
            train_config=train_config,
            sde=sde,
            ode=FlowODESampler(sigmas),
            guidance_scale=s.guidance_scale,
            window_size=s.sde_window_size,
            window_schedule=s.sde_window_schedule,
            window_range=s.sde_window_range,
            window_stride=s.sde_window_stride,
            window_shift_every=s.sde_window_shift_every,
            window_shift_every_min=s.sde_window_shift_every_min,
            window_wrap=s.sde_window_wrap,
            same_initial_noise=s.same_initial_noise,
            num_groups=train_config.train.prompts_per_iteration,
            batch_size=train_config.train.rollout_batch_size,
            measure_kl=measure_kl,
            keep_means=keep_means,
        )
        if rollout.trainable_per_trajectory == 0:
            hint = "raise sampler.noise_level"
            if s.sde_window_size:
                hint = (
                    "the window can land on deterministic steps only (CPS's last step has no "
                    f"noise): raise sde_window_size or keep it off the last step, e.g. "
                    f"sampler.sde_window_range=[0, {s.num_steps - 1}]"
                )
            raise ConfigError(f"sampler {s.name!r} has no stochastic step to train: {hint}")
        return rollout

    @property
    def sampler(self) -> GaussianFlowSampler:
        """The stochastic step (what ``rescore`` scores transitions with)."""
        return self.sde

    @property
    def num_steps(self) -> int:
        """Sampling steps ``T`` of a trajectory."""
        return self.sde.num_steps

    @property
    def trainable_per_trajectory(self) -> int:
        """Stochastic steps with non-zero noise in every trajectory (the same each iteration)."""
        stochastic = self.sde.stochastic_steps
        if self.window_size == 0:
            return int(stochastic.sum())
        # A window may cover a deterministic step (CPS's last one); plan for the worst window
        # that can actually occur.
        size = self.window_size
        return min(int(stochastic[i : i + size].sum()) for i in self.possible_window_starts())

    def possible_window_starts(self) -> list[int]:
        """Every start the window schedule can produce."""
        return possible_window_starts(
            self.num_steps,
            self.window_size,
            self.window_schedule,  # type: ignore[arg-type]
            self.window_range,
            self.window_stride,
        )

    def window(self, noise: RolloutNoise) -> torch.Tensor:
        """``[T]`` bool: the steps sampled stochastically in this iteration (same for all)."""
        if self.window_size == 0:
            return torch.ones(self.num_steps, dtype=torch.bool)
        start = sde_window_start(
            self.num_steps,
            self.window_size,
            self.window_schedule,  # type: ignore[arg-type]
            noise.iteration,
            noise.generator(Streams.SDE_WINDOW),
            self.window_range,
            self.window_stride,
            self.window_shift_every,
            self.window_wrap,
            self.window_shift_every_min,
        )
        return sde_window_mask(self.num_steps, self.window_size, start)

    @torch.no_grad()
    def collect(
        self, policy: FlowPolicy, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> FlowTrajectory:
        """Sample this process's trajectories, recording every state and step log-prob."""
        run = self._begin(policy, prompts, group_ids, noise)
        self._advance(policy, run, slice(0, len(prompts)))
        return run.batch

    def chunks(self, num_samples: int) -> list[slice]:
        """Chunks of ``train.rollout_batch_size`` samples."""
        return chunk_rows(num_samples, self.batch_size)

    def stream(
        self, policy: FlowPolicy, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> ChunkStream[FlowTrajectory]:
        """``collect`` one chunk of ``train.rollout_batch_size`` samples after the other: each
        chunk takes every step before the next starts. Every forward sees the rows ``collect``
        gives it (it also splits each step into these chunks) and the noise is the same, so
        the batch is ``collect``'s."""
        with torch.no_grad():
            run = self._begin(policy, prompts, group_ids, noise)
        for rows in self.chunks(len(prompts)):
            with torch.no_grad():
                self._advance(policy, run, rows)
            yield Chunk(rows, run.batch.select(rows))
        return run.batch

    def _begin(
        self, policy: FlowPolicy, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> _Run:
        """The trajectories' buffers, initial noise and ODE prefix (shared within a group when
        the group starts from one noise), and the step noise of the whole batch."""
        device = policy.device
        n, shape = len(prompts), tuple(policy.latent_shape)
        window = self.window(noise)
        condition = policy.encode_prompts(prompts)
        if self.same_initial_noise:
            x = noise.randn_per_group(
                Streams.INITIAL_NOISE, shape, group_ids, self.num_groups, device
            )
        else:
            x = noise.randn(Streams.INITIAL_NOISE, shape, device)
        latents = [x]
        prefix = int(window.float().argmax()) if bool(window.any()) else self.num_steps
        sigmas = self.sde.sigmas.to(device)
        if self.same_initial_noise and prefix > 0:
            unique, inverse = torch.unique(group_ids, return_inverse=True)
            # Any member represents its group: they share prompt and initial noise.
            members = torch.zeros(len(unique), dtype=torch.long, device=device)
            members[inverse.to(device)] = torch.arange(n, device=device)
            xs = self._ode_steps(policy, x[members], _take(condition, members), sigmas, 0, prefix)
            latents += [state[inverse.to(device)] for state in xs]
        else:
            latents += self._ode_steps(policy, x, condition, sigmas, 0, prefix)
        states = torch.empty(n, self.num_steps + 1, *shape, device=device, dtype=x.dtype)
        states[:, : prefix + 1] = torch.stack(latents, dim=1)
        trainable = (window & self.sde.stochastic_steps.cpu()).to(device)
        batch = FlowTrajectory(
            prompts=list(prompts),
            group_ids=group_ids,
            condition=condition,
            latents=states,
            log_probs=torch.zeros(n, self.num_steps, device=device),
            trainable_steps=trainable.expand(n, -1).clone(),
            advantages=torch.zeros(n, device=device),
            step_kl=torch.zeros(n, self.num_steps, device=device) if self.measure_kl else None,
            means=torch.zeros(n, self.num_steps, *shape, device=device)
            if self.keep_means
            else None,
        )
        # Step noise is drawn (on the CPU) and moved before the loop: a host-to-device copy inside
        # it would wait for the queued forward and stall the accelerator every step.
        step_noise = {
            i: noise.randn((Streams.STEP_NOISE, i), shape, device)
            for i in range(self.num_steps)
            if window[i]
        }
        return _Run(batch, window, prefix, sigmas, step_noise)

    def _advance(self, policy: FlowPolicy, run: _Run, rows: slice) -> None:
        """Take the steps after the prefix for the trajectories at ``rows``, recording them in
        ``run.batch``."""
        batch, window, sigmas = run.batch, run.window, run.sigmas
        condition = {k: v[rows] for k, v in batch.condition.items()}
        x = batch.latents[rows, run.prefix].clone()  # contiguous, as the forwards expect
        last = rows.stop >= len(batch.latents)
        for i in range(run.prefix, self.num_steps):
            v = self._velocity(policy, x, sigmas[i], condition)
            if window[i]:
                # The last chunk frees the step's noise (the whole batch's, one latent each).
                step_noise = run.step_noise.pop(i) if last else run.step_noise[i]
                out = self.sde.step(v, i, x, noise=step_noise[rows])
                batch.log_probs[rows, i] = out.log_prob
                if batch.means is not None:
                    batch.means[rows, i] = out.mean
                if batch.step_kl is not None:
                    batch.step_kl[rows, i] = self._step_kl(policy, x, sigmas[i], condition, i, out)
                x = out.prev_sample
            else:
                x = self.ode.step(v, i, x).prev_sample
            batch.latents[rows, i + 1] = x

    def _step_kl(
        self,
        policy: FlowPolicy,
        x: torch.Tensor,
        sigma: torch.Tensor,
        condition: dict[str, torch.Tensor],
        step: int,
        out: Any,
    ) -> torch.Tensor:
        """``[n]`` exact KL of the step just taken to the reference policy's step from the same
        state (``mean((mu - mu_ref)^2) / (2 std^2)``, as Flow-GRPO's pipelines compute it for
        ``kl_reward``: their ``std_dev_t`` there includes ``sqrt(-dt)``)."""
        with policy.reference():
            v_ref = self._velocity(policy, x, sigma, condition)
        ref_mean = self.sde.step(v_ref, step, x, prev_sample=out.prev_sample).mean
        random = out.std > 0  # a deterministic step (CPS's last) has no density, hence no KL
        safe = torch.where(random, out.std, torch.ones_like(out.std))
        kl = gaussian_mean_kl(out.mean, ref_mean, safe, self.sde.log_prob_reduction)
        return torch.where(random, kl, torch.zeros_like(kl))

    def rescore(self, velocity: torch.Tensor, units: FlowTransitions) -> StepOutput:
        """Each transition's step output under ``velocity``, with the sampler that drew it."""
        return self.sde.step(
            velocity, units.timestep_index, units.sample, prev_sample=units.next_sample
        )

    def _ode_steps(
        self,
        policy: FlowPolicy,
        x: torch.Tensor,
        condition: dict[str, torch.Tensor],
        sigmas: torch.Tensor,
        start: int,
        stop: int,
    ) -> list[torch.Tensor]:
        states = []
        for i in range(start, stop):
            v = self._velocity(policy, x, sigmas[i], condition)
            x = self.ode.step(v, i, x).prev_sample
            states.append(x)
        return states

    def _velocity(
        self,
        policy: FlowPolicy,
        x: torch.Tensor,
        sigma: torch.Tensor,
        condition: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """The velocity of a batch, in chunks of ``batch_size`` samples when set (memory)."""
        n = len(x)
        size = self.batch_size or n
        chunks = [
            policy.velocity(
                x[start : start + size],
                sigma.expand(len(x[start : start + size])),
                {k: v[start : start + size] for k, v in condition.items()},
                self.guidance_scale,
            )
            for start in range(0, n, size)
        ]
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


@dataclass
class _Run:
    """A rollout in progress: its batch (filled step by step), the iteration's window, the ODE
    prefix's length, the noise levels and the step noise of the whole batch."""

    batch: FlowTrajectory
    window: torch.Tensor
    prefix: int
    sigmas: torch.Tensor
    step_noise: dict[int, torch.Tensor]


def _take(condition: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The prompt encodings of ``rows``."""
    return {k: v[rows] for k, v in condition.items()}
