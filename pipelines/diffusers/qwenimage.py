"""Qwen-Image (``QwenImagePipeline``) text-to-image as a flow policy.

What differs from FLUX, read from ``QwenImagePipeline.__call__`` (diffusers 0.42):

* CFG ("true CFG", ``true_cfg_scale``, on when a negative prompt is given) is rescaled to the
  conditional prediction's norm over each token's channels (``Guidance(normalize=True)``);
* prompt embeddings (the last hidden state of Qwen2.5-VL over a chat template whose first 34
  tokens are dropped) are as long as the longest prompt of the batch, truncated at
  ``max_sequence_length`` (512), with a mask; conditional and unconditional embeddings differ in
  length, so CFG pads them to a common length (``sequence_masks``);
* latents are normalised per channel (``latents_mean``/``latents_std``) and packed into 2x2
  patches, ``[(H/16) * (W/16), 4 C]``; the VAE is a video VAE (one frame);
* the transformer takes ``timestep = sigma`` (``1000 s`` rounded to the latent dtype, / 1000) and
  the image grid ``img_shapes`` for its RoPE.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from pipelines.base import Condition
from pipelines.diffusers.flow_hooks import Guidance, flux_style_schedule
from pipelines.diffusers.flow_image import FlowImagePolicy, check_divisible


class QwenImagePolicy(FlowImagePolicy):
    """Qwen-Image; see ``FlowImagePolicy`` for the arguments."""

    pipeline_class = "QwenImagePipeline"
    default_guidance = Guidance(normalize=True)
    time_input = "sigma"
    per_channel_latents = True
    sequence_masks: ClassVar[dict[str, str]] = {"prompt_embeds": "prompt_embeds_mask"}

    def _encode(self, prompts: list[str]) -> Condition:
        embeds, mask = self.pipe.encode_prompt(
            prompts, device=self.device, max_sequence_length=self.max_sequence_length
        )
        if mask is None:  # the pipeline drops an all-ones mask; our batches keep one
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask}

    def _latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        factor = self.pipe.vae_scale_factor
        check_divisible(height, width, factor * 2, "QwenImage (VAE factor x 2x2 packing)")
        channels = self.pipe.transformer.config.in_channels  # 4x the VAE channels
        return ((height // factor // 2) * (width // factor // 2), channels)

    def _scheduler_kwargs(self, num_steps: int) -> dict[str, Any]:
        return flux_style_schedule(self.pipe.scheduler.config, self.latent_shape[0], num_steps)

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        factor = self.pipe.vae_scale_factor * 2
        mask = condition["prompt_embeds_mask"]
        return {
            "hidden_states": latents,
            "timestep": time,
            "guidance": self.embedded_guidance_input(len(latents)),
            "encoder_hidden_states": condition["prompt_embeds"],
            # As the pipeline: no mask when nothing is padded (the fast attention path).
            "encoder_hidden_states_mask": None if bool(mask.all()) else mask,
            "img_shapes": [[(1, self.height // factor, self.width // factor)]] * len(latents),
        }

    def _to_vae_layout(self, latents: torch.Tensor) -> torch.Tensor:
        factor = self.pipe.vae_scale_factor
        return self.pipe._unpack_latents(latents, self.height, self.width, factor)

    def _from_vae(self, decoded: torch.Tensor) -> torch.Tensor:
        return decoded[:, :, 0]  # [B, 3, 1, H, W] -> [B, 3, H, W]
