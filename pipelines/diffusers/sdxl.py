"""Stable Diffusion XL (``StableDiffusionXLPipeline``) as a DDIM diffusion policy.

Condition, as ``pipe.encode_prompt`` and ``pipe(...)`` make it: the two CLIP encoders'
penultimate hidden states side by side ``prompt_embeds [B, 77, D1 + D2]``, the second
encoder's pooled projection ``pooled_prompt_embeds [B, P]`` and SDXL's size conditioning
``time_ids [B, 6]`` (original size, crop top-left, target size: Podell et al. 2023, sec. 2.2),
which the UNet receives as ``added_cond_kwargs``. With an empty negative prompt and the
checkpoint's ``force_zeros_for_empty_prompt`` (SDXL base), the unconditional embedding is
zeros, as the stock call's default ``negative_prompt=None`` gives.
"""

from __future__ import annotations

from typing import Any

import torch

from pipelines.base import Condition
from pipelines.diffusers.diffusion_unet import DiffusionUNetPolicy


class StableDiffusionXLPolicy(DiffusionUNetPolicy):
    """SDXL base; see ``DiffusionUNetPolicy`` for the arguments."""

    pipeline_class = "StableDiffusionXLPipeline"
    upcast_vae = True

    def _time_ids(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """``[n, 6]`` size conditioning of the stock call's defaults: original and target size
        the image size, crop at (0, 0)."""
        size = (self.height, self.width)
        encoder_2 = self.pipe.text_encoder_2
        ids = self.pipe._get_add_time_ids(
            size,
            (0, 0),
            size,
            dtype=dtype,
            text_encoder_projection_dim=encoder_2.config.projection_dim,
        )
        return ids.to(self.device).expand(n, -1)

    def _encode(self, prompts: list[str]) -> Condition:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, num_images_per_prompt=1,
            do_classifier_free_guidance=False,
        )  # fmt: skip
        return {
            "prompt_embeds": embeds,
            "pooled_prompt_embeds": pooled,
            "time_ids": self._time_ids(len(prompts), embeds.dtype),
        }

    def _encode_negative(self) -> Condition:
        # None (not "") for the empty prompt: that is what zeroes it under
        # force_zeros_for_empty_prompt, as in a stock call without a negative prompt.
        _, embeds, _, pooled = self.pipe.encode_prompt(
            prompt=[""], device=self.device, num_images_per_prompt=1,
            do_classifier_free_guidance=True, negative_prompt=self.negative_prompt or None,
        )  # fmt: skip
        return {
            "prompt_embeds": embeds,
            "pooled_prompt_embeds": pooled,
            "time_ids": self._time_ids(1, embeds.dtype),
        }

    def _unet_inputs(self, condition: Condition) -> dict[str, Any]:
        return {
            "encoder_hidden_states": condition["prompt_embeds"],
            "added_cond_kwargs": {
                "text_embeds": condition["pooled_prompt_embeds"],
                "time_ids": condition["time_ids"],
            },
        }
