"""Reward of the embedded video task: is it the prompt's digit, and does it move the right way?

Both parts read the clip through the ink's centre of mass (pixel intensities are the weights):

- ``digit``: on every frame, the 8x8 window whose centre is nearest the centroid (clamped to the
  canvas) goes to the embedded digit classifier; the score is its probability of the prompt's
  digit, averaged over frames.
- ``motion``: with ``d`` the centroid's displacement from the first to the last frame and ``u``
  the prompt's unit direction, ``clip((d . u - |d x u|) / (speed * (F - 1)), 0, 1)``: 1 for the
  full expected travel straight in the asked direction; sideways drift is subtracted and motion
  the wrong way scores 0.

The primary score ``moving_digit`` is ``digit_weight * digit + (1 - digit_weight) * motion``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from reward_models.base import RewardModel, RewardOutput

WINDOW = 8  # the classifier's input size


def ink_centroids(frames: torch.Tensor) -> torch.Tensor:
    """Intensity-weighted centres ``[N, 2]`` (row, col) of frames ``[N, H, W]`` in ``[0, 1]``;
    a frame without ink gets the canvas centre."""
    _, height, width = frames.shape
    mass = frames.sum(dim=(1, 2))
    rows = torch.arange(height, dtype=frames.dtype, device=frames.device)
    cols = torch.arange(width, dtype=frames.dtype, device=frames.device)
    cy = (frames.sum(dim=2) * rows).sum(dim=1) / mass.clamp_min(1e-6)
    cx = (frames.sum(dim=1) * cols).sum(dim=1) / mass.clamp_min(1e-6)
    empty = mass < 1e-6
    cy = torch.where(empty, torch.full_like(cy, (height - 1) / 2), cy)
    cx = torch.where(empty, torch.full_like(cx, (width - 1) / 2), cx)
    return torch.stack([cy, cx], dim=-1)


def centred_windows(frames: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """The ``8 x 8`` windows ``[N, 1, 8, 8]`` of frames ``[N, H, W]`` centred (to the nearest
    pixel) on ``centroids`` ``[N, 2]``, shifted inwards where they would leave the frame."""
    n, height, width = frames.shape
    # The window's centre sits between pixels 3 and 4, hence the 3.5.
    top = (centroids[:, 0] - (WINDOW - 1) / 2).round().long().clamp(0, height - WINDOW)
    left = (centroids[:, 1] - (WINDOW - 1) / 2).round().long().clamp(0, width - WINDOW)
    patches = F.unfold(frames[:, None], WINDOW)  # [N, 64, L], L = (H - 7) * (W - 7)
    index = (top * (width - WINDOW + 1) + left)[:, None, None].expand(n, WINDOW * WINDOW, 1)
    return patches.gather(2, index).reshape(n, 1, WINDOW, WINDOW)


def motion_scores(
    videos: torch.Tensor, steps: torch.Tensor, expected_travel: float
) -> torch.Tensor:
    """``[B]`` motion scores of videos ``[B, F, 1, H, W]`` against unit steps ``[B, 2]`` (dy, dx).

    ``clip((d . u - |d x u|) / expected_travel, 0, 1)`` with ``d`` the first-to-last centroid
    displacement."""
    batch = videos.shape[0]
    ends = torch.stack([videos[:, 0, 0], videos[:, -1, 0]], dim=1)  # [B, 2, H, W]
    centroids = ink_centroids(ends.flatten(0, 1)).reshape(batch, 2, 2)
    d = centroids[:, 1] - centroids[:, 0]  # [B, 2] (dy, dx)
    along = (d * steps).sum(-1)
    across = (d[:, 0] * steps[:, 1] - d[:, 1] * steps[:, 0]).abs()
    return ((along - across) / expected_travel).clamp(0.0, 1.0)


class MovingDigitReward(RewardModel):
    """Scores clips ``[B, F, 1, H, W]`` in ``[0, 1]`` against prompts like "a 3 moving left".

    Returns ``moving_digit`` (primary), ``digit``, ``motion`` and ``accuracy`` (fraction of frames
    whose window the classifier reads as the prompt's digit).

    Args:
        path: digit-classifier safetensors; None uses the embedded one.
        device: where to run the classifier.
        speed: expected pixels per frame (the embedded clips move 1).
        digit_weight: weight of ``digit`` in the primary score (the rest is ``motion``).
    """

    name = "moving_digit"
    accepts = ("videos",)

    def __init__(
        self,
        path: str | None = None,
        device: str | torch.device = "cpu",
        speed: float = 1.0,
        digit_weight: float = 0.5,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"{self.name}: speed must be positive, got {speed}")
        if not 0.0 <= digit_weight <= 1.0:
            raise ValueError(f"{self.name}: digit_weight must be in [0, 1], got {digit_weight}")
        self.path = path
        self.device = torch.device(device)
        self.speed = speed
        self.digit_weight = digit_weight
        self._model: torch.nn.Module | None = None

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            from tasks.digits import load_classifier

            self._model = load_classifier(self.path).to(self.device).eval()
        return self._model

    @torch.no_grad()
    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        from tasks.video_digits import DIRECTION_STEPS, parse_video_prompt

        if outputs.ndim != 5 or outputs.shape[2] != 1 or min(outputs.shape[3:]) < WINDOW:
            raise ValueError(
                f"{self.name}: expected grey videos [B, F, 1, H, W] (H, W >= 8) in [0, 1], "
                f"got {tuple(outputs.shape)}"
            )
        if outputs.shape[1] < 2:
            raise ValueError(f"{self.name}: a clip needs at least 2 frames to move")
        videos = outputs.float().to(self.device)
        batch, frames, _, height, width = videos.shape
        parsed = {p: parse_video_prompt(p) for p in dict.fromkeys(prompts)}  # groups repeat
        digits = torch.tensor([parsed[p][0] for p in prompts], device=self.device)
        steps = torch.tensor(
            [DIRECTION_STEPS[parsed[p][1]] for p in prompts], dtype=torch.float32
        ).to(self.device)

        flat = videos.reshape(batch * frames, height, width)
        windows = centred_windows(flat, ink_centroids(flat))
        probs = self.model(windows).softmax(-1).reshape(batch, frames, -1)
        target = probs.gather(2, digits[:, None, None].expand(batch, frames, 1)).squeeze(2)
        digit = target.mean(1)
        accuracy = (probs.argmax(-1) == digits[:, None]).float().mean(1)
        motion = motion_scores(videos, steps, self.speed * (frames - 1))
        primary = self.digit_weight * digit + (1.0 - self.digit_weight) * motion
        scores = {self.name: primary, "digit": digit, "motion": motion, "accuracy": accuracy}
        return RewardOutput({k: v.cpu() for k, v in scores.items()})
