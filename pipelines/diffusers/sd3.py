"""Stable Diffusion 3 / 3.5 (``StableDiffusion3Pipeline``) as a flow policy.

Condition: the joint CLIP-L + CLIP-G + T5 token embeddings ``prompt_embeds [B, L, D]`` and the
pooled CLIP embeddings ``pooled_prompt_embeds [B, P]``, exactly as ``pipe.encode_prompt`` makes
them. The MM-DiT takes ``timestep = 1000 * sigma``.
"""

from __future__ import annotations

from typing import Any

import torch

from pipelines.base import Condition
from pipelines.diffusers.flow_hooks import dynamic_shift
from pipelines.diffusers.flow_image import FlowImagePolicy


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
        ``StableDiffusion3Pipeline`` computes it (its default ``max_shift`` is 1.16)."""
        del num_steps
        config = self.pipe.scheduler.config
        if not config.get("use_dynamic_shifting", False):
            return {}
        patch = self.pipe.transformer.config.patch_size
        tokens = (self.latent_shape[1] // patch) * (self.latent_shape[2] // patch)
        return {"mu": dynamic_shift({"max_shift": 1.16, **config}, tokens)}

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        return {
            "hidden_states": latents,
            "timestep": time,
            "encoder_hidden_states": condition["prompt_embeds"],
            "pooled_projections": condition["pooled_prompt_embeds"],
        }
