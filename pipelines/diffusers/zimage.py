"""Z-Image (``ZImagePipeline``) as a flow policy.

What differs, read from ``ZImagePipeline.__call__`` (diffusers 0.42):

* the transformer takes lists, one tensor per sample: latents ``[C, 1, H/8, W/8]`` and each
  prompt's unpadded embeddings (Qwen3's penultimate hidden state over the chat-templated
  prompt); the condition here keeps them padded with a mask and unpads them per call;
* time runs the other way, ``(1000 - t) / 1000``, and the output is minus the velocity;
* CFG is ``v_c + g (v_c - v_u)``: the pipeline's ``guidance_scale g`` is genrl's
  ``sampler.guidance_scale`` ``1 + g`` (Z-Image-Turbo's ``g = 0``: no CFG); its
  ``cfg_normalization=r`` clamps the guided velocity's norm to ``r`` times the conditional one's
  (``cfg_max_norm_ratio`` here) and its ``cfg_truncation c`` is ``cfg_cutoff_sigma = 1 - c``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from pipelines.base import Condition
from pipelines.diffusers.flow_hooks import flux_style_schedule
from pipelines.diffusers.flow_image import FlowImagePolicy, check_divisible


class ZImagePolicy(FlowImagePolicy):
    """Z-Image (Turbo, Base). Arguments of ``FlowImagePolicy`` plus:

    Args:
        cfg_max_norm_ratio: the pipeline's ``cfg_normalization`` (0: off, its default).
    """

    pipeline_class = "ZImagePipeline"
    time_input = "reversed"
    prediction_sign = -1.0
    sequence_masks: ClassVar[dict[str, str]] = {"prompt_embeds": "prompt_embeds_mask"}

    def __init__(
        self, pretrained: str | None = None, *, cfg_max_norm_ratio: float = 0.0, **kwargs: Any
    ) -> None:
        super().__init__(pretrained, **kwargs)
        self.guidance = dataclasses.replace(self.guidance, max_norm_ratio=cfg_max_norm_ratio)

    def _image_size(self, height: int | None, width: int | None) -> tuple[int, int]:
        return height or 1024, width or 1024  # the pipeline's default

    def _encode(self, prompts: list[str]) -> Condition:
        # The pipeline templates its prompt list in place: hand it a copy.
        embeds, _ = self.pipe.encode_prompt(
            [str(p) for p in prompts],
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        width = max(len(e) for e in embeds)
        padded = embeds[0].new_zeros(len(embeds), width, embeds[0].shape[-1])
        mask = torch.zeros(len(embeds), width, dtype=torch.long, device=padded.device)
        for i, e in enumerate(embeds):
            padded[i, : len(e)], mask[i, : len(e)] = e, 1
        return {"prompt_embeds": padded, "prompt_embeds_mask": mask}

    def _latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        factor = self.pipe.vae_scale_factor
        check_divisible(height, width, factor * 2, "Z-Image")
        return (self.pipe.transformer.config.in_channels, height // factor, width // factor)

    def _scheduler_kwargs(self, num_steps: int) -> dict[str, Any]:
        _, h, w = self.latent_shape
        return flux_style_schedule(self.pipe.scheduler.config, (h // 2) * (w // 2), num_steps)

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        masks = condition["prompt_embeds_mask"].bool()
        captions = [e[m] for e, m in zip(condition["prompt_embeds"], masks, strict=True)]
        return {"x": list(latents.unsqueeze(2).unbind(0)), "t": time, "cap_feats": captions}

    def _model_output(self, output: torch.Tensor) -> torch.Tensor:
        return output.squeeze(2)  # [B, C, 1, H, W] -> [B, C, H, W]
