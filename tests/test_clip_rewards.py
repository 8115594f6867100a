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


@pytest.mark.parametrize("size", [32, 128])
def test_pickscore_equals_clip_logits_from_the_stock_processor(clip_dir: Path, size: int) -> None:
    """At the model's size the preprocessing is exact; downsampled (128 -> 32 px, antialiased
    in both) it agrees with PIL's resize to within interpolation differences."""
    from PIL import Image
    from transformers import CLIPModel, CLIPProcessor

    images = _images(3, size)
    if size > 32:  # smooth images: resizing noise would compare interpolation kernels only
        images = torch.nn.functional.avg_pool2d(images, 9, stride=1, padding=4)
    reward = build_reward("pickscore", model=str(clip_dir), normalizer=1.0)
    ours = reward(images, PROMPTS).scores["pickscore"]

    model = CLIPModel.from_pretrained(str(clip_dir)).eval()
    processor = CLIPProcessor.from_pretrained(str(clip_dir))
    pil = [Image.fromarray((img * 255).round().byte().permute(1, 2, 0).numpy()) for img in images]
    inputs = processor(text=PROMPTS, images=pil, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**inputs).logits_per_image  # [images, texts] = exp(logit_scale) * cos
    assert torch.allclose(ours, logits.diagonal(), atol=1e-4 if size == 32 else 2e-2)


def test_clipscore_is_clamped_scaled_cosine(clip_dir: Path) -> None:
    from transformers import CLIPModel, CLIPTokenizer

    images = _images(3)
    output = build_reward("clipscore", model=str(clip_dir))(images, PROMPTS)
    # By hand: projected embeddings, cosine, 2.5 * max(cos, 0).
    model = CLIPModel.from_pretrained(str(clip_dir)).eval()
    tokens = CLIPTokenizer.from_pretrained(str(clip_dir))(
        PROMPTS, padding=True, return_tensors="pt"
    )
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
    with torch.no_grad():
        text = projected_embedding(model.get_text_features(**tokens))
        image = projected_embedding(model.get_image_features(pixel_values=(images - mean) / std))
    cosine = torch.nn.functional.cosine_similarity(image, text)
    assert torch.allclose(output.scores["clip_cosine"], cosine, atol=1e-5)
    assert torch.allclose(output.scores["clipscore"], 2.5 * cosine.clamp(min=0), atol=1e-5)


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


def test_aesthetic_reward_by_hand(clip_dir: Path, tmp_path: Path) -> None:
    """The predictor's MLP on the L2-normalised CLIP image embedding (projection 16 here), with
    a head saved like the original ``.pth`` state dict; batched == one by one; gradients flow."""
    from transformers import CLIPModel, CLIPProcessor

    from reward_models.aesthetic import AestheticMLP

    torch.manual_seed(0)
    head = AestheticMLP(16)
    torch.save(head.state_dict(), tmp_path / "head.pth")
    reward = build_reward("aesthetic", model=str(clip_dir), head=str(tmp_path / "head.pth"))
    images = _images(3)
    ours = reward(images, PROMPTS).scores["aesthetic"]
    model = CLIPModel.from_pretrained(str(clip_dir)).eval()
    processor = CLIPProcessor.from_pretrained(str(clip_dir))
    pixels = processor(
        images=[(i * 255).round().byte().permute(1, 2, 0).numpy() for i in images],
        return_tensors="pt",
    )
    with torch.no_grad():
        embedding = projected_embedding(
            model.get_image_features(pixel_values=pixels["pixel_values"])
        )
        expected = head.eval()(torch.nn.functional.normalize(embedding, dim=-1))
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    single = torch.cat(
        [reward(images[i : i + 1], PROMPTS[i : i + 1]).scores["aesthetic"] for i in range(3)]
    )
    torch.testing.assert_close(single, ours, atol=1e-5, rtol=0)
    grad_images = images.clone().requires_grad_(True)
    reward.differentiable(grad_images, PROMPTS).sum().backward()
    assert grad_images.grad is not None and grad_images.grad.abs().sum() > 0
    torch.save({"wrong": torch.zeros(1)}, tmp_path / "bad.pth")
    with pytest.raises(ValueError, match="not a 16-input predictor"):
        build_reward("aesthetic", model=str(clip_dir), head=str(tmp_path / "bad.pth"))(
            images, PROMPTS
        )
