"""FLUX.1 (``FluxPipeline``) as a flow policy.

FLUX works on packed latents: 2x2 patches of the VAE latent become tokens, so a sample is
``[(H/16) * (W/16), 4 C]``; the sampler's math is element-wise and does not care. FLUX.1-dev is
guidance-distilled: ``embedded_guidance`` feeds the guidance embedding (the pipeline's
``guidance_scale``, 3.5 by default); ``sampler.guidance_scale > 1`` adds true classifier-free
guidance on top (the pipeline's ``true_cfg_scale``). The transformer takes ``timestep = sigma``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from pipelines.base import Condition
from pipelines.flow_image import FlowImagePolicy, check_divisible


class FluxPolicy(FlowImagePolicy):
    """FLUX.1-dev/schnell. Arguments of ``FlowImagePolicy`` plus:

    Args:
        embedded_guidance: value of the guidance embedding for guidance-distilled models
            (FLUX.1-dev: 3.5; ignored by models without one, such as schnell).
    """

    pipeline_class = "FluxPipeline"

    def __init__(
        self, pretrained: str | None = None, *, embedded_guidance: float = 3.5, **kwargs: Any
    ):
        self.embedded_guidance = embedded_guidance
        super().__init__(pretrained, **kwargs)

    def _encode(self, prompts: list[str]) -> Condition:
        embeds, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            device=self.device,
            max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

    def _encode_negative(self) -> Condition:
        return self._encode([self.negative_prompt])

    def _latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        factor = self.pipe.vae_scale_factor
        check_divisible(height, width, factor * 2, "FLUX (VAE factor x 2x2 packing)")
        channels = self.pipe.transformer.config.in_channels  # already 4x the VAE channels
        return ((height // factor // 2) * (width // factor // 2), channels)

    def _scheduler_kwargs(self, num_steps: int) -> dict[str, Any]:
        # As FluxPipeline: sigmas linspace(1, 1/N, N), shifted by mu from the token count.
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        config = self.pipe.scheduler.config
        mu = calculate_shift(
            self.latent_shape[0],
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        return {"sigmas": np.linspace(1.0, 1 / num_steps, num_steps), "mu": mu}

    def forward_model(
        self, module: nn.Module, latents: torch.Tensor, sigma: torch.Tensor, condition: Condition
    ) -> torch.Tensor:
        dtype = self.model_dtype
        n, device = latents.shape[0], latents.device
        guidance = None
        if self.pipe.transformer.config.guidance_embeds:
            guidance = torch.full((n,), self.embedded_guidance, device=device)
        factor = self.pipe.vae_scale_factor
        h, w = self.height // factor, self.width // factor
        image_ids = self.pipe._prepare_latent_image_ids(n, h // 2, w // 2, device, dtype)
        embeds = condition["prompt_embeds"].to(dtype)
        text_ids = torch.zeros(embeds.shape[1], 3, device=device, dtype=dtype)
        # The pipeline rounds 1000 * sigma to the latent dtype before dividing by 1000.
        timestep = self.timesteps(sigma).to(dtype) / 1000
        out = module(
            hidden_states=latents.to(dtype),
            timestep=timestep,
            guidance=guidance,
            pooled_projections=condition["pooled_prompt_embeds"].to(dtype),
            encoder_hidden_states=embeds,
            txt_ids=text_ids,
            img_ids=image_ids,
            return_dict=False,
        )[0]
        return out.float()

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        config = self.pipe.vae.config
        factor = self.pipe.vae_scale_factor
        latents = self.pipe._unpack_latents(latents, self.height, self.width, factor)
        latents = latents / config.scaling_factor + config.shift_factor
        return self.pipe.vae.decode(latents, return_dict=False)[0]
