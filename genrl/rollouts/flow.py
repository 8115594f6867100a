"""What every flow-model rollout shares: the ``sampler.*`` config sections, decoding in chunks,
and held-out outputs by the deterministic ODE from fixed-seed noise (their evaluation).

A run's ``sampler`` section is the class its rollout reads (``Algorithm.sections``):
``FlowSamplingConfig`` for ODE endpoints (RAM, GDRO, DiffusionNFT), ``StochasticSamplingConfig``
for trees of stochastic steps (BranchGRPO), ``SDESamplingConfig`` (``flow_sde.py``) for
trajectories with SDE windows (Flow-GRPO and its variants).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

from genrl.config.errors import ConfigError, unknown_message
from genrl.data.batches import FlowBatch
from genrl.policies.protocols import FlowPolicy
from genrl.rollouts.base import OutputFn, Rollout
from samplers.flow_ode import integrate

FB = TypeVar("FB", bound=FlowBatch)


@dataclass
class FlowSamplingConfig:
    """``sampler.*``: the noise schedule, guidance and step counts of a flow rollout."""

    num_steps: int = 10
    """Sampling steps in rollouts (Flow-GRPO: 10)."""
    shift: float | None = None
    """SD3 time shift of a linear sigma schedule; None uses the model's own scheduler exactly as
    its diffusers pipeline does (the embedded model: linear, shift 1)."""
    guidance_scale: float = 1.0
    """Classifier-free guidance in rollouts and training; 1 disables CFG (single forward)."""
    eval_num_steps: int = 10
    """Deterministic ODE steps of held-out evaluation (Flow-GRPO evaluates real models with
    40)."""

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the field."""
        for key in ("num_steps", "eval_num_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"sampler.{key} must be >= 1, got {getattr(self, key)}")
        if self.shift is not None and self.shift <= 0:
            raise ConfigError(f"sampler.shift must be positive or none, got {self.shift}")
        if self.guidance_scale < 1:
            raise ConfigError(
                f"sampler.guidance_scale must be >= 1 (1 = no CFG), got {self.guidance_scale}"
            )


@dataclass
class StochasticSamplingConfig(FlowSamplingConfig):
    """``sampler.*`` of rollouts made of stochastic steps with log-probs."""

    name: str = "flow_sde"
    """Stochastic sampler (registry ``samplers.SAMPLERS``): ``flow_sde`` (Flow-GRPO),
    ``flow_sde_linear`` (Flow-GRPO's Wan variant, diffusion linear in the noise level),
    ``dance_sde`` (DanceGRPO, constant diffusion) or ``flow_cps`` (coefficients-preserving)."""
    noise_level: float = 0.7
    """Noise of the stochastic sampler: ``a`` in Flow-GRPO's ``sigma_s = a*sqrt(s/(1-s))``
    (0.7), the factor on ``flow_sde_linear``'s ``sigma_s ~ s`` (1.0), DanceGRPO's constant
    ``eta`` (0.3), or CPS's ``a`` in ``std = s_next*sin(a*pi/2)``."""
    log_prob_reduction: Literal["mean", "sum"] = "mean"
    """Reduce per-element log-probs by mean (Flow-GRPO; clip ranges ~1e-4) or sum."""

    def validate(self) -> None:
        super().validate()
        from samplers import SAMPLERS

        if self.name not in SAMPLERS:
            raise ConfigError(
                unknown_message(self.name, list(SAMPLERS), "sampler.name", value=True)
            )
        low, high = getattr(SAMPLERS[self.name], "noise_level_range", (0.0, float("inf")))
        if not low <= self.noise_level <= high:
            raise ConfigError(
                f"sampler.noise_level must lie in [{low}, {high}] for {self.name}, "
                f"got {self.noise_level}"
            )
        if not getattr(SAMPLERS[self.name], "stochastic", False):
            stochastic = [n for n, c in SAMPLERS.items() if getattr(c, "stochastic", False)]
            raise ConfigError(
                f"sampler.name={self.name!r} is deterministic; rollouts need a stochastic "
                f"sampler ({', '.join(stochastic)})"
            )


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
