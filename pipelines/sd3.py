"""Stable Diffusion 3 / 3.5 (``StableDiffusion3Pipeline``) as a flow policy.

Condition: the joint CLIP-L + CLIP-G + T5 token embeddings ``prompt_embeds [B, L, D]`` and the
pooled CLIP embeddings ``pooled_prompt_embeds [B, P]``, exactly as ``pipe.encode_prompt`` makes
them. The MM-DiT takes ``timestep = 1000 * sigma``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipelines.base import Condition
from pipelines.flow_image import FlowImagePolicy, check_divisible


class SD3Policy(FlowImagePolicy):
    """SD3/SD3.5 medium/large; see ``FlowImagePolicy`` for the arguments."""

    pipeline_class = "StableDiffusion3Pipeline"

    def _encode(self, prompts: list[str]) -> Condition:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

    def _encode_negative(self) -> Condition:
        _, embeds, _, pooled = self.pipe.encode_prompt(
            prompt=[""],
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            do_classifier_free_guidance=True,
            negative_prompt=self.negative_prompt,
            max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

    def _scheduler_kwargs(self, num_steps: int) -> dict[str, Any]:
        """``mu`` from the image token count when the scheduler shifts by resolution, as
        ``StableDiffusion3Pipeline`` computes it."""
        del num_steps
        config = self.pipe.scheduler.config
        if not config.get("use_dynamic_shifting", False):
            return {}
        from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import (
            calculate_shift,
        )

        patch = self.pipe.transformer.config.patch_size
        tokens = (self.latent_shape[1] // patch) * (self.latent_shape[2] // patch)
        mu = calculate_shift(
            tokens,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.16),
        )
        return {"mu": mu}

    def _latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        factor = self.pipe.vae_scale_factor
        check_divisible(height, width, factor * self.pipe.transformer.config.patch_size)
        channels = self.pipe.transformer.config.in_channels
        return (channels, height // factor, width // factor)

    def forward_model(
        self, module: nn.Module, latents: torch.Tensor, sigma: torch.Tensor, condition: Condition
    ) -> torch.Tensor:
        dtype = self.model_dtype
        out = module(
            hidden_states=latents.to(dtype),
            timestep=self.timesteps(sigma),
            encoder_hidden_states=condition["prompt_embeds"].to(dtype),
            pooled_projections=condition["pooled_prompt_embeds"].to(dtype),
            return_dict=False,
        )[0]
        return out.float()

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        config = self.pipe.vae.config
        latents = latents / config.scaling_factor + config.shift_factor
        return self.pipe.vae.decode(latents, return_dict=False)[0]
