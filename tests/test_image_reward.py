"""ImageReward on transformers' BLIP components against the ``image-reward`` package itself: a
tiny random ImageReward is built by the package (under the shims of
``tests/image_reward_reference.py``), saved like ``ImageReward.pt`` and loaded by our reward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from image_reward_reference import build_reference, package_available

from reward_models import build_reward

PROMPTS = ["a red cat", "a photo of the blue dog", "a red cat"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not package_available():  # imported only after its shims
        pytest.skip("the reference needs: pip install --no-deps image-reward==1.5")
    model, kwargs = build_reference(tmp_path_factory.mktemp("image_reward"))
    return {"model": model, "kwargs": kwargs}


def pictures(n: int, size: int) -> torch.Tensor:
    pixels = torch.randint(0, 256, (n, 3, size, size), generator=torch.Generator().manual_seed(0))
    return pixels.float() / 255


@pytest.mark.parametrize("size", [32, 96])
def test_scores_equal_the_package(reference: dict, size: int) -> None:
    """At the ViT's size preprocessing is exact; 96 -> 32 px (antialiased bicubic in both)
    agrees within interpolation differences on smooth images."""
    from PIL import Image

    images = pictures(3, size)
    if size > 32:
        images = torch.nn.functional.avg_pool2d(images, 9, stride=1, padding=4)
    ours = build_reward("image_reward", **reference["kwargs"])(images, PROMPTS).scores[
        "image_reward"
    ]
    arrays = [(i * 255).round().byte().permute(1, 2, 0).numpy() for i in images]
    with torch.no_grad():
        theirs = [
            reference["model"].score(p, Image.fromarray(a))
            for p, a in zip(PROMPTS, arrays, strict=True)
        ]
    torch.testing.assert_close(
        ours, torch.tensor(theirs), atol=1e-4 if size == 32 else 5e-2, rtol=0
    )


def test_batched_deterministic_and_differentiable(reference: dict) -> None:
    reward = build_reward("image_reward", **reference["kwargs"])
    images = pictures(3, 32)
    scores = reward(images, PROMPTS).scores["image_reward"]
    single = torch.cat(
        [reward(images[i : i + 1], PROMPTS[i : i + 1]).scores["image_reward"] for i in range(3)]
    )
    torch.testing.assert_close(single, scores, atol=1e-5, rtol=0)
    assert torch.equal(reward(images, PROMPTS).scores["image_reward"], scores)
    grad_images = images.clone().requires_grad_(True)
    reward.differentiable(grad_images, PROMPTS).sum().backward()
    assert grad_images.grad is not None and grad_images.grad.abs().sum() > 0


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.pt not found"):
        build_reward("image_reward", checkpoint=str(tmp_path / "missing.pt"))(pictures(1, 8), ["a"])
