"""FLUX.1 (``FluxPipeline``) as a flow policy.

FLUX works on packed latents: 2x2 patches of the VAE latent become tokens, so a sample is
``[(H/16) * (W/16), 4 C]``; the sampler's math is element-wise and does not care. FLUX.1-dev is
guidance-distilled: ``embedded_guidance`` feeds the guidance embedding (the pipeline's
``guidance_scale``, 3.5 by default); ``sampler.guidance_scale > 1`` adds true classifier-free
guidance on top (the pipeline's ``true_cfg_scale``). The transformer takes ``timestep = sigma``.
"""

from __future__ import annotations

from typing import Any

import torch

from pipelines.base import Condition
from pipelines.diffusers.flow_hooks import flux_style_schedule
from pipelines.diffusers.flow_image import FlowImagePolicy, check_divisible


class FluxPolicy(FlowImagePolicy):
    """FLUX.1-dev/schnell; see ``FlowImagePolicy`` for the arguments (``embedded_guidance``
    defaults to FLUX.1-dev's 3.5 and is ignored by models without the embedding, such as
    schnell)."""

    pipeline_class = "FluxPipeline"
    default_embedded_guidance = 3.5
    time_input = "sigma"  # the pipeline rounds 1000 * sigma to the latent dtype, then / 1000

    def _encode(self, prompts: list[str]) -> Condition:
        embeds, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            device=self.device,
            max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

    def _latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        factor = self.pipe.vae_scale_factor
        check_divisible(height, width, factor * 2, "FLUX (VAE factor x 2x2 packing)")
        channels = self.pipe.transformer.config.in_channels  # already 4x the VAE channels
        return ((height // factor // 2) * (width // factor // 2), channels)

    def _scheduler_kwargs(self, num_steps: int) -> dict[str, Any]:
        return flux_style_schedule(self.pipe.scheduler.config, self.latent_shape[0], num_steps)

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        n, device, dtype = latents.shape[0], latents.device, latents.dtype
        factor = self.pipe.vae_scale_factor
        h, w = self.height // factor, self.width // factor
        embeds = condition["prompt_embeds"]
        return {
            "hidden_states": latents,
            "timestep": time,
            "guidance": self.embedded_guidance_input(n),
            "pooled_projections": condition["pooled_prompt_embeds"],
            "encoder_hidden_states": embeds,
            "txt_ids": torch.zeros(embeds.shape[1], 3, device=device, dtype=dtype),
            "img_ids": self.pipe._prepare_latent_image_ids(n, h // 2, w // 2, device, dtype),
        }

    def _to_vae_layout(self, latents: torch.Tensor) -> torch.Tensor:
        factor = self.pipe.vae_scale_factor
        return self.pipe._unpack_latents(latents, self.height, self.width, factor)
