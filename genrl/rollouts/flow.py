"""What every flow-model rollout shares: the ``sampler.*`` config sections, decoding in chunks,
and held-out outputs by the deterministic ODE from fixed-seed noise (their evaluation).

A run's ``sampler`` section is the class its rollout reads (``Algorithm.sections``):
``FlowSamplingConfig`` for ODE endpoints (RAM, GDRO, DiffusionNFT), ``StochasticSamplingConfig``
for trees of stochastic steps (BranchGRPO), ``SDESamplingConfig`` (``flow_sde.py``) for
trajectories with SDE windows (Flow-GRPO and its variants).
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from genrl.data.batches import FlowBatch
from genrl.policies.protocols import FlowPolicy
from genrl.rollouts.base import OutputFn, Rollout
from genrl.rollouts.configs import FlowSamplingConfig, StochasticSamplingConfig
from samplers.flow_ode import integrate

FB = TypeVar("FB", bound=FlowBatch)


@torch.no_grad()
def sample_ode(
    policy: FlowPolicy,
    prompts: list[str],
    noise: torch.Tensor,
    num_steps: int,
    shift: float | None = None,
    guidance_scale: float = 1.0,
) -> torch.Tensor:
    """Deterministic Euler-ODE samples ``[N, *event]`` from initial noise ``[N, *event]``, on the
    policy's noise schedule (``shift=None``: the model's own scheduler)."""
    condition = policy.encode_prompts(prompts)
    return integrate(
        lambda x, sigma: policy.velocity(x, sigma, condition, guidance_scale),
        noise.to(policy.device),
        policy.sigma_schedule(num_steps, shift),
    )


def fixed_seed_batch(
    prompts: list[str], per_prompt: int, latent_shape: tuple[int, ...], seed: int
) -> tuple[list[str], torch.Tensor]:
    """The held-out layout: ``P * S`` prompts (sample ``i`` gets ``prompts[i % P]``) and their
    initial noise ``randn(P * S, *latent_shape, generator=manual_seed(seed))``."""
    n = len(prompts) * per_prompt
    order = [prompts[i % len(prompts)] for i in range(n)]
    noise = torch.randn((n, *latent_shape), generator=torch.Generator().manual_seed(seed))
    return order, noise


def ode_outputs(
    policy: FlowPolicy,
    prompts: list[str],
    samples_per_prompt: int,
    seed: int,
    num_steps: int,
    shift: float | None = None,
    guidance_scale: float = 1.0,
) -> OutputFn:
    """Held-out outputs of a flow policy: deterministic ODE samples from the fixed-seed noise of
    ``fixed_seed_batch``, decoded to images."""
    _, noise = fixed_seed_batch(prompts, samples_per_prompt, policy.latent_shape, seed)

    def outputs(chunk: list[str], index: slice) -> torch.Tensor:
        latents = sample_ode(policy, chunk, noise[index], num_steps, shift, guidance_scale)
        return policy.decode(latents)

    return outputs


def decode_in_chunks(policy: FlowPolicy, latents: torch.Tensor, size: int) -> torch.Tensor:
    """Decode ``[N, *event]`` latents ``size`` at a time (0: all at once); a real model's VAE at
    512 px is a memory peak when it decodes a whole local batch."""
    size = size or len(latents)
    return torch.cat([policy.decode(latents[i : i + size]) for i in range(0, len(latents), size)])


class FlowRollout(Rollout[FlowPolicy, FB]):
    """Base of the flow rollouts: outputs are the decoded final samples (``batch.final``), held-out
    outputs the ODE samples of ``sampler.eval_num_steps`` steps with its shift and guidance.

    Args:
        train_config: the run's config (``sampler``, ``eval`` and ``train.rollout_batch_size``).
    """

    def __init__(self, train_config: Any) -> None:
        self.train_config = train_config

    def outputs(self, policy: FlowPolicy, batch: FB) -> torch.Tensor:
        """Decoded images, in chunks of ``train.rollout_batch_size``."""
        return decode_in_chunks(policy, batch.final, self.train_config.train.rollout_batch_size)

    def evaluation_outputs(
        self, policy: FlowPolicy, prompts: list[str], samples_per_prompt: int, seed: int
    ) -> OutputFn:
        s = self.train_config.sampler
        return ode_outputs(
            policy, prompts, samples_per_prompt, seed, s.eval_num_steps, s.shift, s.guidance_scale
        )

    def evaluation_sampling(self) -> str:
        s = self.train_config.sampler
        cfg = "" if s.guidance_scale == 1 else f", guidance {s.guidance_scale:g}"
        return f"the deterministic ODE sampler, {s.eval_num_steps} steps{cfg}, from seeded noise"


__all__ = [
    "FlowRollout",
    "FlowSamplingConfig",
    "StochasticSamplingConfig",
    "decode_in_chunks",
    "fixed_seed_batch",
    "ode_outputs",
    "sample_ode",
]
