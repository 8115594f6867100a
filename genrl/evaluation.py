"""Held-out evaluation: fixed prompts, fixed seeds, deterministic ODE sampling."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from samplers.flow_ode import integrate


@dataclass
class EvalResult:
    """Mean reward over all samples, per prompt, and the samples themselves.

    Attributes:
        reward: mean primary reward over all ``P * S`` samples.
        per_prompt: prompt -> mean reward of its ``S`` samples.
        scores: name -> mean of every score the reward returned.
        outputs: the ``P * S`` decoded samples (images ``[P * S, C, H, W]`` or texts); sample
            ``i`` belongs to prompt ``i % P``.
        prompts: the ``P * S`` prompts in sample order.
    """

    reward: float
    per_prompt: dict[str, float]
    scores: dict[str, float]
    outputs: Any
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


# (prompts of a chunk, their sample indices in the held-out layout) -> decoded outputs
OutputFn = Callable[[list[str], slice], Any]


def flow_outputs(
    policy: Any,
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


@torch.no_grad()
def evaluate(
    policy: Any,
    reward: Any,
    prompts: list[str],
    *,
    samples_per_prompt: int,
    seed: int,
    num_steps: int = 10,
    shift: float | None = None,
    guidance_scale: float = 1.0,
    batch_size: int = 256,
    outputs_fn: OutputFn | None = None,
    accelerator: Any = None,
) -> EvalResult:
    """Score ``samples_per_prompt`` held-out outputs per prompt.

    The layout is fixed so that numbers are comparable across runs and with the manifest of the
    embedded assets: sample ``i`` is conditioned on ``prompts[i % P]``. ``outputs_fn`` makes a
    chunk's outputs (the algorithm's deterministic sampler); by default a flow policy's ODE
    samples from ``randn(P * S, *event, generator=manual_seed(seed))``.

    With an ``accelerator`` of several processes, chunk ``k`` of ``batch_size`` samples is made
    and scored by process ``k % N`` and the results are exchanged, so every process returns the
    one-process result (each chunk's randomness depends on its sample indices only) in about
    ``1 / N`` of the time (not under FSDP or DeepSpeed, whose forwards need every process).
    """
    if outputs_fn is None:
        outputs_fn = flow_outputs(
            policy, prompts, samples_per_prompt, seed, num_steps, shift, guidance_scale
        )
    n = len(prompts) * samples_per_prompt
    all_prompts = [prompts[i % len(prompts)] for i in range(n)]
    rank, world = _process_layout(accelerator)
    mine = []
    for k, start in enumerate(range(0, n, batch_size)):
        if k % world != rank:
            continue
        chunk = all_prompts[start : start + batch_size]
        decoded = outputs_fn(chunk, slice(start, start + len(chunk)))
        scores_k = {name: v.cpu() for name, v in reward(decoded, chunk).scores.items()}
        mine.append((k, decoded.cpu() if isinstance(decoded, torch.Tensor) else decoded, scores_k))
    if world > 1:
        from accelerate.utils import gather_object

        mine = gather_object(mine)  # every process's (index, outputs, scores), in rank order
    mine.sort(key=lambda item: item[0])
    chunks = [item[1] for item in mine]
    score_chunks = [item[2] for item in mine]
    scores = {k: torch.cat([c[k] for c in score_chunks]) for k in score_chunks[0]}
    primary = scores[reward.name]
    per_prompt = {p: float(primary[i :: len(prompts)].mean()) for i, p in enumerate(prompts)}
    if isinstance(chunks[0], torch.Tensor):
        outputs: Any = torch.cat(chunks)
    else:
        outputs = [item for chunk in chunks for item in chunk]
    return EvalResult(
        reward=float(primary.mean()),
        per_prompt=per_prompt,
        scores={k: float(v.mean()) for k, v in scores.items()},
        outputs=outputs,
        prompts=all_prompts,
    )


def _process_layout(accelerator: Any) -> tuple[int, int]:
    """(this process's index, processes sharing the chunks). Sharded models (FSDP, DeepSpeed)
    gather parameters from every process in each forward, so there every process runs every
    chunk in step (a process with fewer chunks would wait for the others forever)."""
    if accelerator is None or accelerator.num_processes == 1:
        return 0, 1
    if str(getattr(accelerator, "distributed_type", "")).upper().endswith(("FSDP", "DEEPSPEED")):
        return 0, 1
    return accelerator.process_index, accelerator.num_processes
