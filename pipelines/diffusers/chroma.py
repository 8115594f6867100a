"""Chroma (``ChromaPipeline``) as a flow policy: written from docs/porting_a_diffusers_model.md.

Read from ``ChromaPipeline.__call__`` (diffusers 0.42): FLUX's packed latents, schedule
(``linspace(1, 1/N, N)`` + ``mu``), ``timestep = sigma`` and VAE un-scaling, so the adapter
derives from ``FluxPolicy``; but T5 only (no pooled CLIP embedding, no guidance embedding), its
embeddings padded to ``max_sequence_length`` with a mask that keeps the first padding token, the
mask extended over the image tokens for the transformer, and plain CFG with a negative prompt.
"""

from __future__ import annotations

from typing import Any

import torch

from pipelines.base import Condition
from pipelines.diffusers.flux import FluxPolicy


class ChromaPolicy(FluxPolicy):
    """Chroma; see ``FlowImagePolicy`` for the arguments."""

    pipeline_class = "ChromaPipeline"

    def _encode(self, prompts: list[str]) -> Condition:
        embeds, _, mask, *_ = self.pipe.encode_prompt(
            prompt=list(prompts),
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask}

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        (n, tokens), device, dtype = latents.shape[:2], latents.device, latents.dtype
        h, w = self.height // self.pipe.vae_scale_factor, self.width // self.pipe.vae_scale_factor
        embeds, mask = condition["prompt_embeds"], condition["prompt_attention_mask"]
        return {
            "hidden_states": latents,
            "timestep": time,
            "encoder_hidden_states": embeds,
            "txt_ids": torch.zeros(embeds.shape[1], 3, device=device, dtype=dtype),
            "img_ids": self.pipe._prepare_latent_image_ids(n, h // 2, w // 2, device, dtype),
            "attention_mask": self.pipe._prepare_attention_mask(n, tokens, mask.dtype, mask),
        }
