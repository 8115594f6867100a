"""Tiny random vision backbones saved like hub checkpoints (offline), for the reward tests."""

from __future__ import annotations

from pathlib import Path

import torch


def build_dinov2(directory: Path, image_size: int = 32, registers: int = 0) -> Path:
    """A 2-layer DINOv2 (hidden 32, patch 8) with a BiT image processor (short side
    ``image_size + 4``, centre crop ``image_size``), saved to ``directory``."""
    import json

    from transformers import (
        Dinov2Config,
        Dinov2Model,
        Dinov2WithRegistersConfig,
        Dinov2WithRegistersModel,
    )

    torch.manual_seed(0)
    options = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=image_size,
        patch_size=8,
    )
    if registers:
        model = Dinov2WithRegistersModel(
            Dinov2WithRegistersConfig(num_register_tokens=registers, **options)
        )
    else:
        model = Dinov2Model(Dinov2Config(**options))
    model.save_pretrained(directory)
    # Written as JSON (what the hub ships) rather than through BitImageProcessor, whose class
    # differs between transformers 4 and 5.
    processor = {
        "image_processor_type": "BitImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": image_size + 4},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": image_size, "width": image_size},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
        "do_convert_rgb": True,
    }
    (directory / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    return directory


def write_images(directory: Path, images: torch.Tensor, prefix: str = "ref") -> list[Path]:
    """Save ``[B, 3, H, W]`` images in ``[0, 1]`` as PNGs; returns their paths."""
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        array = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        path = directory / f"{prefix}{i}.png"
        Image.fromarray(array).save(path)
        paths.append(path)
    return paths
