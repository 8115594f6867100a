"""Qwen-Image-Edit (``QwenImageEditPipeline``): Qwen-Image conditioned on a reference image.

Each prompt carries its reference image in a dataset column (``images`` by default: a path or a
PIL image, or a list whose first entry is used). Read from ``QwenImageEditPipeline.__call__``
(diffusers 0.42), beyond what ``QwenImagePolicy`` does:

* the reference is resized to about 1024 x 1024 pixels at its own aspect ratio
  (``calculate_dimensions``, multiples of 32) whatever the output size;
* the prompt is encoded together with the reference image by Qwen2.5-VL (its processor), and so
  is the negative prompt: the unconditional branch of CFG keeps the image, so the negative
  embeddings are per prompt and travel in the condition;
* the reference's VAE latents (the distribution's mode, normalised per channel, packed) are
  appended to the noisy tokens, ``img_shapes`` lists both grids for RoPE, and the prediction is
  the output's first ``latent_shape[0]`` tokens.

RoPE takes the first sample's grids for the whole batch, so the references of one batch must
share an aspect ratio.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from pipelines.base import Condition
from pipelines.diffusers.qwenimage import QwenImagePolicy
from tasks.prompt import prompt_columns

REFERENCE_AREA = (
    1024 * 1024
)  # QwenImageEditPipeline.__call__: calculate_dimensions(1024 * 1024, ...)


class QwenImageEditPolicy(QwenImagePolicy):
    """Qwen-Image-Edit. Arguments of ``FlowImagePolicy`` plus:

    Args:
        image_column: the prompt column holding each prompt's reference image.
    """

    pipeline_class = "QwenImageEditPipeline"
    sequence_masks: ClassVar[dict[str, str]] = {
        "prompt_embeds": "prompt_embeds_mask",
        "negative_prompt_embeds": "negative_prompt_embeds_mask",
    }

    def __init__(
        self, pretrained: str | None = None, *, image_column: str = "images", **kwargs: Any
    ) -> None:
        self.image_column = image_column
        super().__init__(pretrained, **kwargs)

    def _reference(self, prompt: str) -> Any:
        value = prompt_columns(prompt).get(self.image_column)
        if isinstance(value, list | tuple):
            value = value[0] if value else None
        if value is None:
            raise ValueError(
                f"{type(self).__name__}: prompt {str(prompt)[:60]!r} has no reference image "
                f"(dataset column {self.image_column!r})"
            )
        if isinstance(value, str | Path):
            from PIL import Image

            value = Image.open(value).convert("RGB")
        return value

    def _encode(self, prompts: list[str]) -> Condition:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

        images = [self._reference(p) for p in prompts]
        sizes = {calculate_dimensions(REFERENCE_AREA, i.size[0] / i.size[1])[:2] for i in images}
        if len(sizes) > 1:
            raise ValueError(f"reference images of one batch must share an aspect ratio: {sizes}")
        ((width, height),) = sizes
        images = [self.pipe.image_processor.resize(i, height, width) for i in images]
        texts, negatives = [str(p) for p in prompts], [self.negative_prompt] * len(prompts)
        positive = self._text(texts, images)
        negative = self._text(negatives, images)
        pixels = self.pipe.image_processor.preprocess(images, height, width).unsqueeze(2)
        vae = self.pipe.vae
        latents = self.pipe._encode_vae_image(pixels.to(vae.device, vae.dtype), generator=None)
        n, channels, _, h, w = latents.shape
        return {
            **positive,
            "negative_prompt_embeds": negative["prompt_embeds"],
            "negative_prompt_embeds_mask": negative["prompt_embeds_mask"],
            "image_latents": self.pipe._pack_latents(latents, n, channels, h, w),
            "reference_grid": torch.tensor([[h // 2, w // 2]] * n, device=latents.device),
        }

    def _text(self, texts: list[str], images: list[Any]) -> Condition:
        embeds, mask = self.pipe.encode_prompt(
            texts, image=images, device=self.device, max_sequence_length=self.max_sequence_length
        )
        if mask is None:
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask}

    def null_condition(self, condition: Condition) -> Condition:
        """The negative prompt encoded with each row's reference image."""
        return {
            **condition,
            "prompt_embeds": condition["negative_prompt_embeds"],
            "prompt_embeds_mask": condition["negative_prompt_embeds_mask"],
        }

    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        inputs = super()._model_inputs(latents, time, condition)
        inputs["hidden_states"] = torch.cat([latents, condition["image_latents"]], dim=1)
        reference = (1, *condition["reference_grid"][0].tolist())
        inputs["img_shapes"] = [[inputs["img_shapes"][0][0], reference]] * len(latents)
        return inputs

    def _model_output(self, output: torch.Tensor) -> torch.Tensor:
        return output[:, : self.latent_shape[0]]
