"""CLIPScore and PickScore on a tiny random CLIP model saved to disk and loaded back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers_tiny import build_clip

from reward_models import build_reward
from reward_models.clip import projected_embedding

PROMPTS = ["a red cat", "a blue dog", "a red cat"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_clip(tmp_path_factory.mktemp("clip"))


def _images(n: int, size: int = 32) -> torch.Tensor:
    pixels = torch.randint(0, 256, (n, 3, size, size), generator=torch.Generator().manual_seed(0))
    return pixels.float() / 255


def test_pickscore_equals_clip_logits_from_the_stock_processor(clip_dir: Path) -> None:
    from PIL import Image
    from transformers import CLIPModel, CLIPProcessor

    images = _images(3)
    reward = build_reward("pickscore", model=str(clip_dir), normalizer=1.0)
    ours = reward(images, PROMPTS).scores["pickscore"]

    model = CLIPModel.from_pretrained(str(clip_dir)).eval()
    processor = CLIPProcessor.from_pretrained(str(clip_dir))
    pil = [Image.fromarray((img * 255).round().byte().permute(1, 2, 0).numpy()) for img in images]
    inputs = processor(text=PROMPTS, images=pil, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**inputs).logits_per_image  # [images, texts] = exp(logit_scale) * cos
    assert torch.allclose(ours, logits.diagonal(), atol=1e-4)


def test_clipscore_is_clamped_scaled_cosine(clip_dir: Path) -> None:
    images = _images(3, size=48)  # resized and centre-cropped to 32
    output = build_reward("clipscore", model=str(clip_dir))(images, PROMPTS)
    cosine = output.scores["clip_cosine"]
    assert torch.allclose(output.scores["clipscore"], 2.5 * cosine.clamp(min=0))
    assert cosine.abs().max() <= 1
    # Repeated prompt, different images: different scores, same text embedding.
    assert output.scores["clipscore"].shape == (3,)


def test_differentiable_path_gives_image_gradients(clip_dir: Path) -> None:
    reward = build_reward("pickscore", model=str(clip_dir))
    images = _images(2).requires_grad_(True)
    reward.differentiable(images, PROMPTS[:2]).sum().backward()
    assert images.grad is not None and images.grad.abs().sum() > 0


def test_errors_and_output_conventions(clip_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="RGB images"):
        build_reward("clipscore", model=str(clip_dir))(torch.zeros(2, 1, 8, 8), PROMPTS[:2])
    with pytest.raises(ValueError, match="cannot load"):
        build_reward("clipscore", model=str(tmp_path / "missing"))(_images(1), PROMPTS[:1])
    # transformers 4.x returns the projected embedding itself, 5.x an output object.
    embedding = torch.ones(2, 4)
    assert projected_embedding(embedding) is embedding

    class Output:
        pooler_output = embedding

    assert projected_embedding(Output()) is embedding
