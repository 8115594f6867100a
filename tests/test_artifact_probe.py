"""The artifact probe: corruptions by hand, probe training, the embedded probe, a probe on a tiny
DINOv2 from a labelled folder, the CLI, and the embedded task with the probe as regulariser."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from vision_tiny import build_dinov2, write_images

from genrl.cli.train_reward import (
    CORRUPTIONS,
    corrupt,
    synthetic_digits,
    train_artifact_probe,
    train_probe,
)
from genrl.config.errors import ConfigError
from reward_models import build_reward
from reward_models.artifact import load_probe


def test_blur_and_grid_by_hand() -> None:
    image = torch.zeros(1, 1, 8, 8)
    image[0, 0, 3, 3] = 1.0
    image[0, 0, 0, 0] = 1.0
    blurred = corrupt(image, "blur", torch.Generator().manual_seed(0))
    assert blurred[0, 0, 3, 3] == pytest.approx(1 / 9) and blurred[0, 0, 2, 4] == pytest.approx(
        1 / 9
    )
    assert blurred[0, 0, 0, 0] == pytest.approx(1 / 4)  # corner window: 2 x 2 pixels
    assert blurred[0, 0, 6, 6] == 0
    grid = corrupt(torch.zeros(1, 1, 8, 8), "grid", torch.Generator().manual_seed(0))
    lit_rows = (grid[0, 0] > 0).all(dim=1)
    lit_columns = (grid[0, 0] > 0).all(dim=0)
    assert lit_rows.sum() + lit_columns.sum() in (3, 4)  # every 2nd or 3rd row or column of 8
    assert 0.4 <= float(grid.max()) <= 0.8


def test_noise_and_duplicate_strokes() -> None:
    image = torch.zeros(2, 1, 8, 8)
    image[:, 0, 2:6, 4] = 1.0  # a vertical stroke
    first = corrupt(image, "duplicate", torch.Generator().manual_seed(1))
    again = corrupt(image, "duplicate", torch.Generator().manual_seed(1))
    assert torch.equal(first, again)  # reproducible from the generator
    assert (first >= image).all() and first.sum() == 2 * image.sum()  # a shifted copy laid over
    noisy = corrupt(image, "noise", torch.Generator().manual_seed(2))
    assert float(noisy.min()) >= 0 and float(noisy.max()) <= 1 and not torch.equal(noisy, image)
    with pytest.raises(ValueError, match="unknown corruption"):
        corrupt(image, "jpeg", torch.Generator())


def test_probe_training_separates_separable_features() -> None:
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(200) % 2
    features = torch.randn(200, 5, generator=generator) + 3 * labels[:, None].float()
    kinds = ["clean" if label == 0 else "artifact" for label in labels.tolist()]
    probe, metrics = train_probe(features, labels.float(), kinds, epochs=100)
    assert metrics["heldout_accuracy"] > 0.95
    assert set(metrics["heldout_accuracy_by_kind"]) == {"artifact", "clean"}
    # Standardisation statistics come from the training split.
    assert torch.allclose(probe.mean[:1], features[:, :1].mean(0), atol=0.5)


def test_embedded_probe_prefers_clean_digits() -> None:
    images, labels, kinds = synthetic_digits(per_prompt=2, seed=5)  # not the training seed
    assert set(kinds) == {"clean", *CORRUPTIONS} and labels.sum() == len(labels) / 2
    reward = build_reward("artifact_probe")
    out = reward(images, ["p"] * len(images))
    scores = out.scores["artifact_probe"]
    assert scores[labels == 0].mean() > scores[labels == 1].mean() + 0.5
    assert torch.allclose(scores, 1 - out.scores["artifact_probability"])
    one_by_one = torch.cat(
        [reward(images[i : i + 1], ["p"]).scores["artifact_probe"] for i in range(6)]
    )
    torch.testing.assert_close(one_by_one, scores[:6])
    _, backbone, metrics = load_probe(reward.path)
    assert backbone == "digits" and metrics["heldout_accuracy"] >= 0.9


def smooth_and_noisy(directory: Path) -> Path:
    base = torch.linspace(0, 1, 40).view(1, 1, 1, 40).expand(8, 3, 40, 40).clone()
    base = base * torch.rand(8, 3, 1, 1, generator=torch.Generator().manual_seed(0))
    write_images(directory / "clean", base)
    noise = torch.rand(base.shape, generator=torch.Generator().manual_seed(1))
    write_images(directory / "artifact", (base + 0.5 * noise).clamp(0, 1))
    return directory


def test_probe_on_a_dino_backbone_from_a_folder(tmp_path: Path) -> None:
    dino = build_dinov2(tmp_path / "dino")
    data = smooth_and_noisy(tmp_path / "data")
    path, metrics = train_artifact_probe(
        tmp_path / "probe.safetensors", str(data), backbone=f"dino:{dino}", hidden=0, epochs=200
    )
    assert metrics["train_images"] + metrics["heldout_images"] == 16
    probe, backbone, _ = load_probe(path)
    assert backbone == f"dino:{dino}" and probe.feature_dim == 32
    reward = build_reward("artifact_probe", path=str(path))
    scores = reward(torch.rand(3, 3, 40, 40), ["p"] * 3).scores["artifact_probe"]
    assert scores.shape == (3,) and ((scores >= 0) & (scores <= 1)).all()
    with pytest.raises(ValueError, match="holds no images"):
        train_artifact_probe(tmp_path / "x.safetensors", str(tmp_path / "dino"), backbone="digits")


@pytest.mark.slow
def test_cli_trains_a_probe(tmp_path: Path) -> None:
    out = tmp_path / "probe.safetensors"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "genrl.cli.main",
            "train-reward",
            "artifact",
            "--epochs",
            "50",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "held-out accuracy" in result.stdout and out.is_file()


def test_embedded_task_takes_the_probe_as_a_second_reward_with_one_override(tmp_path: Path) -> None:
    from tiny import tiny_config

    from genrl import Trainer

    config = tiny_config(tmp_path, "reward.1.name=artifact_probe", "reward.1.weight=0.5")
    assert [spec.name for spec in config.reward] == ["digit_classifier", "artifact_probe"]
    metrics = Trainer(config, run_dir=tmp_path / "run").train_iteration()
    for name in (
        "digit_classifier/mean",
        "artifact_probe/mean",
        "artifact_probe/artifact_probability/mean",
    ):
        assert 0 <= metrics[name] <= 1
    with pytest.raises(ConfigError, match="expected an index below 2"):
        config.apply_overrides(["reward.3.name=artifact_probe"])
