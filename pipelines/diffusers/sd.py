"""Stable Diffusion 1.x / 2.x (``StableDiffusionPipeline``) as a DDIM diffusion policy.

Condition: the CLIP text encoder's last hidden state ``prompt_embeds [B, 77, D]``, exactly as
``pipe.encode_prompt`` makes it; the UNet cross-attends to it. SD 1.5 predicts the noise
(epsilon), SD 2.x at 768 px predicts ``v``: the scheduler config says which, and the DDIM step
reads it from there.
"""

from __future__ import annotations

from typing import Any

from pipelines.base import Condition
from pipelines.diffusers.diffusion_unet import DiffusionUNetPolicy


class StableDiffusionPolicy(DiffusionUNetPolicy):
    """SD 1.x / 2.x; see ``DiffusionUNetPolicy`` for the arguments."""

    pipeline_class = "StableDiffusionPipeline"

    def _encode(self, prompts: list[str]) -> Condition:
        embeds, _ = self.pipe.encode_prompt(prompts, self.device, 1, False)
        return {"prompt_embeds": embeds}

    def _encode_negative(self) -> Condition:
        _, negative = self.pipe.encode_prompt(
            [""], self.device, 1, True, negative_prompt=[self.negative_prompt]
        )
        return {"prompt_embeds": negative}

    def _unet_inputs(self, condition: Condition) -> dict[str, Any]:
        return {"encoder_hidden_states": condition["prompt_embeds"]}
