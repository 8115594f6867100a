"""LTX-Video text-to-video (``LTXPipeline``) as a flow policy.

Latents: the transformer's patch tokens over the VAE latent grid, ``[F' * H' * W', C]`` for the
released checkpoints' 1 x 1 x 1 patches (``latent_tokens``: the layout ``LTXPipeline`` denoises
in and takes as ``latents=``), with ``F' = (num_frames - 1) / 8 + 1`` and ``H' = height / 32``
from the VAE's own compression ratios. Condition: T5 embeddings padded to
``max_sequence_length`` (128) with their attention mask. The transformer takes ``timestep =
1000 * sigma``, the latent grid's size and the RoPE scale ``(8 / frame_rate, 32, 32)``.

Schedule: ``sigmas = linspace(1, 1/N, N)`` with ``mu`` from ``F' * H' * W'`` (``sigma_grid =
"flux"``), as ``LTXPipeline.__call__``. Decoding un-normalises with the VAE's per-channel
``latents_mean`` / ``latents_std`` buffers over its ``scaling_factor``; VAEs with timestep
conditioning (0.9.1 and later) decode at ``decode_timestep`` with ``decode_noise_scale`` noise
(``FlowImagePolicy`` arguments; the stock call's defaults are 0 and "same as the timestep", and
the model cards use 0.05 and 0.025).

The stock call's ``guidance_rescale`` is the adapter's ``guidance_rescale`` (default 0, as there).
"""

from __future__ import annotations

from typing import Any

import torch

from pipelines.base import Condition
from pipelines.diffusers.flow_hooks import vae_compression
from pipelines.diffusers.flow_image import FlowImagePolicy


class LTXPolicy(FlowImagePolicy):
    """LTX-Video 0.9.x text-to-video; see ``FlowImagePolicy`` for the arguments (``height`` /
    ``width`` default to the pipeline's 512 x 704, ``num_frames`` to 161, ``frame_rate`` to
    25)."""

    pipeline_class = "LTXPipeline"
    per_channel_latents = True
    latent_tokens = True
    sigma_grid = "flux"

    def _encode(self, prompts: list[str]) -> Condition:
        embeds, mask, _, _ = self.pipe.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask}

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        frames, height, width = self.latent_grid
        spatial, temporal = vae_compression(self.pipe)
        return {
            "hidden_states": latents,
            "encoder_hidden_states": condition["prompt_embeds"],
            "timestep": time,
            "encoder_attention_mask": condition["prompt_attention_mask"],
            "num_frames": frames,
            "height": height,
            "width": width,
            "rope_interpolation_scale": (temporal / self.frame_rate, spatial, spatial),
        }
