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
from pipelines.flow_image import FlowImagePolicy


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

    def _latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        factor = self.pipe.vae_scale_factor
        _check_divisible(height, width, factor * self.pipe.transformer.config.patch_size)
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


def _check_divisible(height: int, width: int, multiple: int, family: Any = "this model") -> None:
    if height % multiple or width % multiple:
        raise ValueError(
            f"height and width must be multiples of {multiple} for {family}, got {height}x{width}"
        )
