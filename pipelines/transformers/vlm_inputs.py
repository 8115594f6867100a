"""A vision-language processor's pixel outputs as per-sample, batch-first tensors, and back.

Minibatches slice rollouts along the batch dimension, so ``VLMPolicy`` keeps every prompt's
pixels in rows of their own (``TokenRollout.model_inputs``):

* processors that return ``image_grid_thw`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) flatten every
  image's patches into one ``[patches, D]`` tensor: ``pack_pixels`` stores them as
  ``pixel_values [B, max_patches, D]`` and ``image_grid_thw [B, max_images, 3]`` (zero rows are
  padding), ``unpack_pixels`` flattens a batch back;
* processors that return one pixel row per image (LLaVA, LLaVA-NeXT, Gemma 3, PaliGemma: every
  output ``[images, ...]``, ``image_sizes`` too) are nested per prompt as ``[B, max_images,
  ...]`` with ``images_per_prompt [B]`` (``IMAGE_COUNTS``); ``unpack_pixels`` concatenates each
  row's own images back, in prompt order, as the model reads them;
* other processors already return one row per prompt and pass through (checked), less the
  outputs that are not pixels (``NOT_PIXELS``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# Processor outputs that are not the prompt's pixels: token-aligned ones (rebuilt from the ids)
# and training targets (PaliGemma's processor returns ``labels``, with which the forward would
# compute a loss against the prompt's ids).
NOT_PIXELS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids", "labels")
# How many images each row holds, for pixels nested per image (a row of zeros: a text prompt).
IMAGE_COUNTS = "images_per_prompt"


def open_image(image: Any) -> Any:
    """A PIL image in RGB from a path or a PIL image."""
    from PIL import Image

    if isinstance(image, str | Path):
        with Image.open(image) as opened:
            return opened.convert("RGB")
    return image.convert("RGB")


def pack_pixels(
    out: Any, counts: list[int], prompts: list[str], per_image: bool = False
) -> dict[str, torch.Tensor]:
    """The processor's pixel outputs for ``U`` prompts (with ``counts`` images each) as
    batch-first tensors ``[U, ...]``; ``per_image``: the processor returns pixel rows per image
    (``VLMPolicy`` asks it)."""
    rows = len(out["input_ids"])
    if "image_grid_thw" in out:  # Qwen: every image's patches flattened into one tensor
        grids = out["image_grid_thw"].split(counts)
        patches = out["pixel_values"].split([int(g.prod(-1).sum()) for g in grids])
        return {
            "pixel_values": stack_padded(list(patches)),
            "image_grid_thw": stack_padded(list(grids)),
        }
    if per_image and any(counts):
        by_prompt = {IMAGE_COUNTS: torch.tensor(counts)}
        for key, value in _pixel_outputs(out):
            if value.shape[0] != sum(counts):
                raise ValueError(
                    f"the processor's {key!r} is not one row per image ({tuple(value.shape)} "
                    f"for {sum(counts)} images); genrl cannot slice it per sample"
                )
            by_prompt[key] = stack_padded(list(value.split(counts)))
        return by_prompt
    pixels = out.get("pixel_values")
    nested = isinstance(pixels, torch.Tensor) and pixels.ndim == 5 and len(pixels) == rows
    if any(counts) and len(set(counts)) > 1 and not nested:
        # The processor refused to say whether its rows are per image (``VLMPolicy`` asks with
        # a two-image prompt): if they are, rows [2 images, 0] look like one row per prompt.
        few, many = counts.index(min(counts)), counts.index(max(counts))
        raise ValueError(
            "this VLM's processor refused a two-image prompt, so genrl cannot tell its pixel "
            "rows per image from rows per prompt and every prompt of a batch must carry as "
            f"many images: {prompts[few][:40]!r} has {counts[few]}, "
            f"{prompts[many][:40]!r} has {counts[many]}"
        )
    packed = {}
    for key, value in _pixel_outputs(out):
        if value.shape[0] != rows:
            raise ValueError(
                f"the processor's {key!r} is not one row per prompt ({tuple(value.shape)} for "
                f"{rows} prompts); genrl cannot slice it per sample"
            )
        packed[key] = value
    return packed


def _pixel_outputs(out: Any) -> list[tuple[str, torch.Tensor]]:
    return [(k, v) for k, v in out.items() if k not in NOT_PIXELS and isinstance(v, torch.Tensor)]


def stack_padded(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``[U, max_len, ...]`` with zero rows after each tensor's own length."""
    width = max(t.shape[0] for t in tensors)
    out = tensors[0].new_zeros(len(tensors), width, *tensors[0].shape[1:])
    for row, tensor in enumerate(tensors):
        out[row, : tensor.shape[0]] = tensor
    return out


def unpack_pixels(inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, Any]:
    """Inverse of ``pack_pixels`` for a batch: the model's own layout."""
    if "image_grid_thw" in inputs:
        grids, pixels = [], []
        for grid, patches in zip(inputs["image_grid_thw"], inputs["pixel_values"], strict=True):
            grid = grid[grid[:, 0] > 0]  # drop the padding rows
            grids.append(grid)
            pixels.append(patches[: int(grid.prod(-1).sum())])
        if not any(len(g) for g in grids):
            return {}
        return {"pixel_values": torch.cat(pixels).to(dtype), "image_grid_thw": torch.cat(grids)}
    if IMAGE_COUNTS in inputs:  # nested per image: each row's own images, in order
        counts = inputs[IMAGE_COUNTS].tolist()
        if not any(counts):
            return {}
        inputs = {
            k: torch.cat([v[row, :count] for row, count in enumerate(counts)])
            for k, v in inputs.items()
            if k != IMAGE_COUNTS
        }
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
