"""Training of the video task's two digit classifiers, for ``scripts/build_video_assets.py``.

1. The reward's window classifier (``DigitClassifier`` with 11 classes): the training split's
   8x8 digits with +-1 pixel shifts, gaussian noise and a light speckle, and an eleventh class,
   "no single digit" (``NO_DIGIT``): speckle alone and digits buried in heavy speckle, the
   grey speckle a Flow-GRPO run against the image task's 10-class classifier learned to add.
   Blends of two digits of different classes were tried as a third kind and left out: that
   classifier read the base generator's blurry digits as blends (probability of the prompt's
   digit 0.024 on the held-out protocol, against 0.213 without blends), leaving RL no signal.
2. The judge (``FrameDigitJudge``): the training split's digits pasted at a uniformly random
   place on a clean 16x16 frame with faint gaussian noise, 10 classes, another seed. It never
   sees speckle, so a speckled frame is off its training distribution: it is a second opinion
   on whether a frame shows the digit, not a copy of the reward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from build_assets import augment

from tasks.digits import DigitClassifier
from tasks.video_digits import NO_DIGIT, FrameDigitJudge

REWARD_CLASSIFIER: dict[str, Any] = {
    "config": {"channels": 16, "hidden_dim": 64, "num_classes": 11},
    "seed": 0,
    "steps": 3000,
    "batch_size": 128,
    "lr": 2e-3,
    "optimizer": "Adam",
    "digits": "shift in {-1,0,1}^2, gaussian noise std ~ U(0, 0.1), then speckle with "
    "density ~ U(0, 0.05) (each pixel, with that probability, raised to a uniform grey "
    "in [0.1, 0.6] if darker)",
    "no_digit_fraction": 0.25,
    "no_digit": "half speckle alone (density ~ U(0.1, 0.5)), half a shifted noisy digit under "
    "speckle of density ~ U(0.3, 0.6)",
    "min_heldout_accuracy": 0.9,
}
JUDGE: dict[str, Any] = {
    "config": {"size": 16, "hidden_dim": 256, "num_classes": 10},
    "seed": 1,
    "steps": 3000,
    "batch_size": 128,
    "lr": 1e-3,
    "optimizer": "Adam",
    "inputs": "the 8x8 digit at a uniformly random top-left in 0..8 of a black 16x16 frame, "
    "gaussian noise std ~ U(0, 0.05), clamped to [0, 1]",
    "min_heldout_accuracy": 0.9,
}


def speckle(images01: torch.Tensor, low: float, high: float, gen: torch.Generator) -> torch.Tensor:
    """Each image's pixels, with a per-image probability ``~ U(low, high)``, raised to a uniform
    grey in ``[0.1, 0.6]`` where they are darker than it."""
    density = low + (high - low) * torch.rand(images01.shape[0], 1, 1, 1, generator=gen)
    hit = torch.rand(images01.shape, generator=gen) < density
    grey = 0.1 + 0.5 * torch.rand(images01.shape, generator=gen)
    return torch.where(hit, torch.maximum(images01, grey), images01)


def no_digit_batch(images01: torch.Tensor, size: int, gen: torch.Generator) -> torch.Tensor:
    """``size`` inputs ``[size, 1, 8, 8]`` of the "no single digit" class: half speckle alone,
    half a digit of ``images01`` under heavy speckle."""
    half = size // 2
    alone = speckle(torch.zeros(half, 1, 8, 8), 0.1, 0.5, gen)
    picks = torch.randint(0, len(images01), (size - half,), generator=gen)
    buried = speckle(augment(images01[picks], gen), 0.3, 0.6, gen)
    return torch.cat([alone, buried])


def train_reward_classifier(
    data: dict[str, torch.Tensor],
) -> tuple[DigitClassifier, dict[str, Any]]:
    cfg = REWARD_CLASSIFIER
    torch.manual_seed(cfg["seed"])  # parameter initialisation
    gen = torch.Generator().manual_seed(cfg["seed"])
    model = DigitClassifier(**cfg["config"])
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    images01, labels = data["train_images"] / 16.0, data["train_labels"]
    negatives = round(cfg["batch_size"] * cfg["no_digit_fraction"])
    positives = cfg["batch_size"] - negatives
    for _ in range(cfg["steps"]):
        idx = torch.randint(0, len(labels), (positives,), generator=gen)
        digits = speckle(augment(images01[idx], gen), 0.0, 0.05, gen)
        inputs = torch.cat([digits, no_digit_batch(images01, negatives, gen)])
        targets = torch.cat([labels[idx], torch.full((negatives,), NO_DIGIT)])
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    test01, test_labels = data["test_images"] / 16.0, data["test_labels"]
    check = torch.Generator().manual_seed(99)
    with torch.no_grad():
        clean = (model(test01).argmax(-1) == test_labels).float().mean()
        specked = speckle(augment(test01, check), 0.0, 0.05, check)
        light = (model(specked).argmax(-1) == test_labels).float().mean()
        junk = no_digit_batch(test01, 300, check)
        rejected = (model(junk).argmax(-1) == NO_DIGIT).float().mean()
    metrics = {
        "final_train_loss": round(loss.item(), 6),
        "heldout_accuracy": round(float(clean), 6),
        "heldout_accuracy_light_speckle": round(float(light), 6),
        "heldout_no_digit_recall": round(float(rejected), 6),
    }
    if metrics["heldout_accuracy"] < cfg["min_heldout_accuracy"]:
        raise RuntimeError(f"reward classifier too weak: {metrics}")
    return model, metrics


def place_on_frames(images01: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """8x8 digits ``[B, 1, 8, 8]`` pasted at uniformly random places on black 16x16 frames."""
    batch = images01.shape[0]
    top = torch.randint(0, 9, (batch,), generator=gen)
    left = torch.randint(0, 9, (batch,), generator=gen)
    rows = top[:, None] + torch.arange(8)  # [B, 8]
    cols = left[:, None] + torch.arange(8)
    frames = torch.zeros(batch, 1, 16, 16)
    b = torch.arange(batch)[:, None, None]
    frames[b, 0, rows[:, :, None], cols[:, None, :]] = images01[:, 0]
    return frames


def train_judge(data: dict[str, torch.Tensor]) -> tuple[FrameDigitJudge, dict[str, Any]]:
    cfg = JUDGE
    torch.manual_seed(cfg["seed"])
    gen = torch.Generator().manual_seed(cfg["seed"])
    model = FrameDigitJudge(**cfg["config"])
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    images01, labels = data["train_images"] / 16.0, data["train_labels"]
    for _ in range(cfg["steps"]):
        idx = torch.randint(0, len(labels), (cfg["batch_size"],), generator=gen)
        frames = place_on_frames(images01[idx], gen)
        std = 0.05 * torch.rand(len(idx), 1, 1, 1, generator=gen)
        frames = (frames + std * torch.randn(frames.shape, generator=gen)).clamp(0.0, 1.0)
        loss = F.cross_entropy(model(frames), labels[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    check = torch.Generator().manual_seed(99)
    test = place_on_frames(data["test_images"] / 16.0, check)
    with torch.no_grad():
        acc = (model(test).argmax(-1) == data["test_labels"]).float().mean()
    metrics = {"final_train_loss": round(loss.item(), 6), "heldout_accuracy": round(float(acc), 6)}
    if metrics["heldout_accuracy"] < cfg["min_heldout_accuracy"]:
        raise RuntimeError(f"judge too weak: {metrics}")
    return model, metrics
