"""Held-out evaluation: fixed prompts, fixed seeds, deterministic ODE sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from samplers import FlowODESampler


@dataclass
class EvalResult:
    """Mean reward over all samples, per prompt, and the samples themselves.

    Attributes:
        reward: mean primary reward over all ``P * S`` samples.
        per_prompt: prompt -> mean reward of its ``S`` samples.
        scores: name -> mean of every score the reward returned.
        images: ``[P * S, C, H, W]`` decoded samples; sample ``i`` belongs to prompt ``i % P``.
        prompts: the ``P * S`` prompts in sample order.
    """

    reward: float
    per_prompt: dict[str, float]
    scores: dict[str, float]
    images: torch.Tensor
    prompts: list[str]


@torch.no_grad()
def sample_ode(
    policy: Any,
    prompts: list[str],
    noise: torch.Tensor,
    num_steps: int,
    shift: float | None = None,
    guidance_scale: float = 1.0,
) -> torch.Tensor:
    """Deterministic Euler-ODE samples ``[N, *event]`` from initial noise ``[N, *event]``, on the
    policy's noise schedule (``shift=None``: the model's own scheduler)."""
    sampler = FlowODESampler(policy.sigma_schedule(num_steps, shift))
    condition = policy.encode_prompts(prompts)
    x = noise.float().to(policy.device)
    sigmas = sampler.sigmas.to(x.device)
    for i in range(num_steps):
        sigma = sigmas[i].expand(x.shape[0])
        v = policy.velocity(x, sigma, condition, guidance_scale)
        x = sampler.step(v, i, x).prev_sample
    return x


def fixed_seed_batch(
    prompts: list[str], per_prompt: int, latent_shape: tuple[int, ...], seed: int
) -> tuple[list[str], torch.Tensor]:
    """The held-out layout: ``P * S`` prompts (sample ``i`` gets ``prompts[i % P]``) and their
    initial noise ``randn(P * S, *latent_shape, generator=manual_seed(seed))``."""
    n = len(prompts) * per_prompt
    order = [prompts[i % len(prompts)] for i in range(n)]
    noise = torch.randn((n, *latent_shape), generator=torch.Generator().manual_seed(seed))
    return order, noise


@torch.no_grad()
def evaluate(
    policy: Any,
    reward: Any,
    prompts: list[str],
    *,
    samples_per_prompt: int,
    seed: int,
    num_steps: int,
    shift: float | None = None,
    guidance_scale: float = 1.0,
    batch_size: int = 256,
) -> EvalResult:
    """Sample ``samples_per_prompt`` images per prompt and score them.

    The protocol is fixed so that numbers are comparable across runs and with the manifest of the
    embedded assets: initial noise ``randn(P * S, *event, generator=manual_seed(seed))`` and
    sample ``i`` conditioned on ``prompts[i % P]``.
    """
    all_prompts, noise = fixed_seed_batch(prompts, samples_per_prompt, policy.latent_shape, seed)
    n = len(all_prompts)
    images, score_chunks = [], []
    for start in range(0, n, batch_size):
        chunk = all_prompts[start : start + batch_size]
        x = sample_ode(
            policy, chunk, noise[start : start + batch_size], num_steps, shift, guidance_scale
        )
        decoded = policy.decode(x)
        images.append(decoded)
        score_chunks.append(reward(decoded, chunk).scores)
    scores = {k: torch.cat([c[k] for c in score_chunks]) for k in score_chunks[0]}
    primary = scores[reward.name]
    per_prompt = {p: float(primary[i :: len(prompts)].mean()) for i, p in enumerate(prompts)}
    return EvalResult(
        reward=float(primary.mean()),
        per_prompt=per_prompt,
        scores={k: float(v.mean()) for k, v in scores.items()},
        images=torch.cat(images),
        prompts=all_prompts,
    )
