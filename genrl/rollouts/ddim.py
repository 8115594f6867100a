"""DDIM trajectories of an epsilon / v-prediction diffusion model (DDPO; Flow-GRPO's objective on
them, ``ddim_grpo``).

Black et al., "Training Diffusion Models with Reinforcement Learning" (DDPO, 2023):
denoising is a multi-step decision process whose every step is the Gaussian DDIM step of
``samplers/ddim.py`` (eta > 0), so each trajectory records its states and the log-prob of each
transition; ``rescore`` scores stored transitions under the current model with the same step.
The trajectories are ``FlowTrajectory`` batches (states ``[N, T + 1, *event]``, per-step
log-probs, trainable steps) since the step-wise objectives read nothing flow-specific from
them; the timestep of step ``i`` is ``sampler.timesteps[i]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from genrl.config.errors import ConfigError
from genrl.data.batches import FlowTrajectory, FlowTransitions
from genrl.data.rng import RolloutNoise, Streams
from genrl.policies.protocols import DiffusionPolicy
from genrl.rollouts.base import Chunk, ChunkStream, OutputFn, Rollout, chunk_rows
from genrl.rollouts.flow import fixed_seed_batch
from samplers.base import StepOutput
from samplers.ddim import DDIMSampler

Condition = dict[str, torch.Tensor]


def predict_in_chunks(
    policy: DiffusionPolicy,
    x: torch.Tensor,
    timestep: torch.Tensor,
    condition: Condition,
    guidance_scale: float,
    size: int = 0,
) -> torch.Tensor:
    """The model's prediction for a batch at one timestep, ``size`` samples per forward (0:
    all at once)."""
    n = len(x)
    size = size or n
    parts = [
        policy.predict(
            x[i : i + size],
            timestep.expand(len(x[i : i + size])),
            {k: v[i : i + size] for k, v in condition.items()},
            guidance_scale,
        )
        for i in range(0, n, size)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


@torch.no_grad()
def sample_ddim(
    policy: DiffusionPolicy,
    prompts: list[str],
    noise: torch.Tensor,
    num_steps: int,
    guidance_scale: float = 1.0,
    eta: float = 0.0,
) -> torch.Tensor:
    """DDIM samples ``[N, *event]`` from initial noise (eta = 0: deterministic DDIM, what
    ``pipe(..., eta=0)`` computes with a ``DDIMScheduler``)."""
    sampler = DDIMSampler(policy.ddim_schedule(num_steps), eta)
    condition = policy.encode_prompts(prompts)
    x = noise.to(policy.device).float()
    timesteps = sampler.timesteps.to(policy.device)
    for i in range(sampler.num_steps):
        output = predict_in_chunks(policy, x, timesteps[i], condition, guidance_scale)
        x = sampler.step(output, i, x).prev_sample
    return x


@dataclass
class DDIMRollout(Rollout[DiffusionPolicy, FlowTrajectory]):
    """Every step a stochastic DDIM step (``sampler.noise_level`` is eta), built from
    ``config.sampler`` on the policy's scheduler (``from_config``)."""

    train_config: Any = field(repr=False)
    sampler: DDIMSampler
    guidance_scale: float
    batch_size: int = 0
    """Samples per forward and per chunk of ``stream`` (``train.rollout_batch_size``)."""
    window_size: int = 0
    """Every step is stochastic and trainable (no SDE window), which the step-wise objectives
    read."""

    @property
    def uses_reference(self) -> bool:
        return False

    @classmethod
    def from_config(cls, train_config: Any, policy: DiffusionPolicy) -> DDIMRollout:
        s = train_config.sampler
        sampler = DDIMSampler(
            policy.ddim_schedule(s.num_steps), s.noise_level, s.log_prob_reduction
        )
        rollout = cls(
            train_config=train_config,
            sampler=sampler,
            guidance_scale=s.guidance_scale,
            batch_size=train_config.train.rollout_batch_size,
        )
        if rollout.trainable_per_trajectory == 0:
            raise ConfigError("the DDIM rollout has no stochastic step: raise sampler.noise_level")
        return rollout

    @property
    def num_steps(self) -> int:
        return self.sampler.num_steps

    @property
    def trainable_per_trajectory(self) -> int:
        """Steps with noise (sigma_t > 0) in every trajectory."""
        return int(self.sampler.stochastic_steps.sum())

    @torch.no_grad()
    def collect(
        self,
        policy: DiffusionPolicy,
        prompts: list[str],
        group_ids: torch.Tensor,
        noise: RolloutNoise,
    ) -> FlowTrajectory:
        batch, step_noise = self._begin(policy, prompts, group_ids, noise)
        self._advance(policy, batch, step_noise, slice(0, len(prompts)))
        return batch

    def chunks(self, num_samples: int) -> list[slice]:
        """Chunks of ``train.rollout_batch_size`` samples."""
        return chunk_rows(num_samples, self.batch_size)

    def stream(
        self,
        policy: DiffusionPolicy,
        prompts: list[str],
        group_ids: torch.Tensor,
        noise: RolloutNoise,
    ) -> ChunkStream[FlowTrajectory]:
        """``collect`` chunk by chunk: each chunk takes every step before the next starts, with
        the same noise, so the batch is ``collect``'s."""
        with torch.no_grad():
            batch, step_noise = self._begin(policy, prompts, group_ids, noise)
        for rows in self.chunks(len(prompts)):
            with torch.no_grad():
                self._advance(policy, batch, step_noise, rows)
            yield Chunk(rows, batch.select(rows))
        return batch

    def _begin(
        self,
        policy: DiffusionPolicy,
        prompts: list[str],
        group_ids: torch.Tensor,
        noise: RolloutNoise,
    ) -> tuple[FlowTrajectory, list[torch.Tensor]]:
        """The batch's buffers with the initial noise, and every step's noise (drawn on the CPU
        from the named streams and moved before the loop)."""
        device = policy.device
        n, shape = len(prompts), tuple(policy.latent_shape)
        states = torch.empty(n, self.num_steps + 1, *shape, device=device)
        states[:, 0] = noise.randn(Streams.INITIAL_NOISE, shape, device)
        trainable = self.sampler.stochastic_steps.to(device)
        batch = FlowTrajectory(
            prompts=list(prompts),
            group_ids=group_ids,
            condition=policy.encode_prompts(prompts),
            latents=states,
            log_probs=torch.zeros(n, self.num_steps, device=device),
            trainable_steps=trainable.expand(n, -1).clone(),
            advantages=torch.zeros(n, device=device),
        )
        step_noise = [
            noise.randn((Streams.STEP_NOISE, i), shape, device) for i in range(self.num_steps)
        ]
        return batch, step_noise

    def _advance(
        self,
        policy: DiffusionPolicy,
        batch: FlowTrajectory,
        step_noise: list[torch.Tensor],
        rows: slice,
    ) -> None:
        condition = {k: v[rows] for k, v in batch.condition.items()}
        x = batch.latents[rows, 0].clone()
        timesteps = self.sampler.timesteps.to(x.device)
        for i in range(self.num_steps):
            output = predict_in_chunks(
                policy, x, timesteps[i], condition, self.guidance_scale, self.batch_size
            )
            out = self.sampler.step(output, i, x, noise=step_noise[i][rows])
            batch.log_probs[rows, i] = out.log_prob
            x = out.prev_sample
            batch.latents[rows, i + 1] = x

    def rescore(self, output: torch.Tensor, units: FlowTransitions) -> StepOutput:
        """Each transition's step under the model output ``output``, with the step that drew it."""
        return self.sampler.step(
            output, units.timestep_index, units.sample, prev_sample=units.next_sample
        )

    def outputs(self, policy: DiffusionPolicy, batch: FlowTrajectory) -> torch.Tensor:
        """Decoded images, in chunks of ``train.rollout_batch_size``."""
        final = batch.final
        size = self.batch_size or len(final)
        return torch.cat([policy.decode(final[i : i + size]) for i in range(0, len(final), size)])

    def evaluation_outputs(
        self, policy: DiffusionPolicy, prompts: list[str], samples_per_prompt: int, seed: int
    ) -> OutputFn:
        """Deterministic DDIM (eta = 0) samples of ``sampler.eval_num_steps`` steps from the
        fixed-seed noise of ``fixed_seed_batch``, decoded."""
        s = self.train_config.sampler
        _, initial = fixed_seed_batch(prompts, samples_per_prompt, policy.latent_shape, seed)

        def outputs(chunk: list[str], index: slice) -> torch.Tensor:
            latents = sample_ddim(
                policy, chunk, initial[index], s.eval_num_steps, s.guidance_scale, eta=0.0
            )
            return policy.decode(latents)

        return outputs

    def evaluation_sampling(self) -> str:
        s = self.train_config.sampler
        cfg = "" if s.guidance_scale == 1 else f", guidance {s.guidance_scale:g}"
        return f"deterministic DDIM (eta 0), {s.eval_num_steps} steps{cfg}, from seeded noise"

    def describe(self) -> dict[str, Any]:
        return {
            "rollout": type(self).__name__,
            "num_steps": self.num_steps,
            "eta": self.sampler.eta,
        }


__all__ = ["DDIMRollout", "predict_in_chunks", "sample_ddim"]
