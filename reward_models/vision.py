"""Image preprocessing shared by the vision-backbone rewards (CLIP, DINOv2, probes).

The stock transformers image processors work on PIL images one at a time. Rewards score batches
of generated images that are already tensors on the accelerator, and reward-gradient methods
need gradients through the preprocessing, so it is redone in torch with the processor's own
settings: bicubic resize of the short side (antialiased, like PIL's), centre crop, normalisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class ImagePreprocess:
    """``[B, C, H, W]`` images in ``[0, 1]`` (C = 1 or 3) -> a normalised backbone input.

    Attributes:
        size: the short side after resizing.
        crop: ``(height, width)`` of the centre crop.
        mean, std: per-channel normalisation (3 values each).
    """

    size: int
    crop: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def from_image_processor(cls, processor: Any) -> ImagePreprocess:
        """Settings of a transformers image processor (CLIP, BiT/DINOv2 and alike)."""
        size = processor.size
        short = _read(size, "shortest_edge") or min(_read(size, "height"), _read(size, "width"))
        crop = getattr(processor, "crop_size", None)
        crop_hw = (_read(crop, "height"), _read(crop, "width")) if crop else (short, short)
        if not getattr(processor, "do_center_crop", True) or not all(crop_hw):
            crop_hw = (short, short)
        return cls(
            size=int(short),
            crop=(int(crop_hw[0]), int(crop_hw[1])),
            mean=tuple(float(m) for m in processor.image_mean),
            std=tuple(float(s) for s in processor.image_std),
        )

    def __call__(self, images: torch.Tensor, device: torch.device | str) -> torch.Tensor:
        if images.ndim != 4 or images.shape[1] not in (1, 3):
            raise ValueError(
                f"expected images [B, 1 or 3, H, W] in [0, 1], got {tuple(images.shape)}"
            )
        images = images.to(device, torch.float32)
        if images.shape[1] == 1:  # grayscale: the backbones take RGB
            images = images.expand(-1, 3, -1, -1)
        h, w = images.shape[-2:]
        scale = self.size / min(h, w)
        resized = (max(self.crop[0], round(h * scale)), max(self.crop[1], round(w * scale)))
        if resized != (h, w):
            # Antialiased like PIL's resize in the stock processors: a 512 -> 224 bicubic
            # without it aliases and moves CLIP scores by ~0.2 logits.
            images = F.interpolate(
                images, size=resized, mode="bicubic", align_corners=False, antialias=True
            )
        top = (images.shape[-2] - self.crop[0]) // 2
        left = (images.shape[-1] - self.crop[1]) // 2
        images = images[..., top : top + self.crop[0], left : left + self.crop[1]]
        mean = torch.tensor(self.mean, device=images.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=images.device).view(1, 3, 1, 1)
        return (images.clamp(0, 1) - mean) / std


def _read(settings: Any, key: str) -> int:
    """A field of a processor's size settings: a dict (transformers 4) or a ``SizeDict`` (5)."""
    value = settings.get(key) if isinstance(settings, dict) else getattr(settings, key, None)
    return int(value or 0)


__all__ = ["ImagePreprocess"]
