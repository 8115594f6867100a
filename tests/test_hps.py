"""HPSv2 on a tiny open_clip model registered from a config, its checkpoint saved like HPS's
``{"state_dict": ...}`` and loaded back through our loader; compared with open_clip's own
preprocessing and encoders."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vision_tiny import build_tiny_hps

from reward_models import build_reward

PROMPTS = ["a red cat", "a blue dog", "a red cat"]


@pytest.fixture(scope="module")
def tiny_hps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_tiny_hps(tmp_path_factory.mktemp("hps"))


def pictures(n: int, size: int) -> torch.Tensor:
    pixels = torch.randint(0, 256, (n, 3, size, size), generator=torch.Generator().manual_seed(0))
    return pixels.float() / 255


@pytest.mark.parametrize("size", [32, 96])
def test_hps_equals_open_clip_scoring(tiny_hps: dict[str, str], size: int) -> None:
    """At the model's size the preprocessing is exact; 96 -> 32 px (antialiased bicubic in both)
    agrees within interpolation differences on smooth images."""
    import open_clip
    from PIL import Image

    images = pictures(3, size)
    if size > 32:
        images = torch.nn.functional.avg_pool2d(images, 9, stride=1, padding=4)
    ours = build_reward("hps", **tiny_hps)(images, PROMPTS).scores["hps"]

    model, _, preprocess = open_clip.create_model_and_transforms("tiny-hps", pretrained=None)
    model.load_state_dict(torch.load(tiny_hps["checkpoint"], weights_only=True)["state_dict"])
    model.eval()
    arrays = [(i * 255).round().byte().permute(1, 2, 0).numpy() for i in images]
    batch = torch.stack([preprocess(Image.fromarray(a)) for a in arrays])
    with torch.no_grad():
        image = model.encode_image(batch, normalize=True)
        text = model.encode_text(open_clip.get_tokenizer("tiny-hps")(PROMPTS), normalize=True)
    expected = (image * text).sum(-1)
    torch.testing.assert_close(ours, expected, atol=1e-5 if size == 32 else 2e-2, rtol=0)


def test_hps_batched_one_by_one_gradients_and_errors(
    tiny_hps: dict[str, str], tmp_path: Path
) -> None:
    reward = build_reward("hps", **tiny_hps)
    images = pictures(3, 48)
    scores = reward(images, PROMPTS).scores["hps"]
    single = torch.cat(
        [reward(images[i : i + 1], PROMPTS[i : i + 1]).scores["hps"] for i in range(3)]
    )
    torch.testing.assert_close(single, scores, atol=1e-5, rtol=0)
    assert torch.equal(reward(images, PROMPTS).scores["hps"], scores)  # deterministic
    grad_images = images.clone().requires_grad_(True)
    reward.differentiable(grad_images, PROMPTS).sum().backward()
    assert grad_images.grad is not None and grad_images.grad.abs().sum() > 0
    torch.save({"state_dict": {"wrong": torch.zeros(1)}}, tmp_path / "bad.pt")
    bad = dict(tiny_hps, checkpoint=str(tmp_path / "bad.pt"))
    with pytest.raises(ValueError, match="does not fit open_clip 'tiny-hps'"):
        build_reward("hps", **bad)(images, PROMPTS)
    with pytest.raises(FileNotFoundError, match="not found"):
        build_reward("hps", checkpoint=str(tmp_path / "missing.pt"))(images, PROMPTS)
