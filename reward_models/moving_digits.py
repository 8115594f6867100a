"""Rewards of the embedded video task: is it the prompt's digit, does it move the right way, and
is the rest of the frame blank?

``moving_digit`` (the training reward) locates the digit on every frame by its *ink*: pixels of
at least ``INK`` (0.3) weigh their intensity, fainter ones nothing, so a grey speckle cannot
drag the location. The centroid of that ink places an 8x8 window, which is moved once onto the
centroid of the ink inside it (stray ink far away then stops pulling it). Three parts:

- ``digit``: the video classifier's probability of the prompt's digit on the window, averaged
  over frames. The classifier has an eleventh class, "no single digit", trained on speckle,
  noise and blends of two digits, so those take probability away from every digit.
- ``motion``: with ``d`` the window centroid's displacement from the first to the last frame
  and ``u`` the prompt's unit direction, ``clip((d . u - |d x u|) / (speed * (F - 1)), 0, 1)``:
  1 for the full travel straight in the asked direction, sideways drift subtracted, 0 the
  wrong way.
- ``tidy``: the fraction of the frame's total intensity inside the window, averaged over frames
  (1 for a rendered clip; speckle or a second blob outside the window lowers it).

The primary score is ``tidy * (digit_weight * digit + (1 - digit_weight) * motion)``: ink
outside the digit's window costs reward in proportion, whatever the classifier thinks.

``moving_digit_judge`` is a held-out second opinion, logged at weight 0: an MLP of another
architecture, trained on other inputs (whole 16x16 frames), reads each frame as it is; its
probability of the prompt's digit is the primary score. Its ``speckle`` is the fraction of
background pixels brighter than ``FAINT`` (0.1), the background being every pixel outside the
bounding box, grown by one pixel, of the pixels brighter than 0.5 (a frame without such
pixels is all background).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from reward_models.base import RewardModel, RewardOutput

WINDOW = 8  # the classifier's input size
INK = 0.3
"""Pixels at least this bright are ink for locating the digit (scikit-learn strokes reach 1)."""
FAINT = 0.1
"""A background pixel brighter than this is speckle (``moving_digit_judge``'s ``speckle``)."""
STROKE = 0.5
"""Pixels brighter than this are the strokes whose bounding box ``speckle`` spares."""


def ink_centroids(frames: torch.Tensor, threshold: float = 0.0) -> torch.Tensor:
    """Centres ``[N, 2]`` (row, col) of frames ``[N, H, W]`` in ``[0, 1]``, each pixel weighted by
    its intensity if it is at least ``threshold`` and by 0 otherwise; a frame without such ink
    gets the canvas centre."""
    _, height, width = frames.shape
    ink = torch.where(frames >= threshold, frames, torch.zeros_like(frames))
    mass = ink.sum(dim=(1, 2))
    rows = torch.arange(height, dtype=frames.dtype, device=frames.device)
    cols = torch.arange(width, dtype=frames.dtype, device=frames.device)
    cy = (ink.sum(dim=2) * rows).sum(dim=1) / mass.clamp_min(1e-6)
    cx = (ink.sum(dim=1) * cols).sum(dim=1) / mass.clamp_min(1e-6)
    empty = mass < 1e-6
    cy = torch.where(empty, torch.full_like(cy, (height - 1) / 2), cy)
    cx = torch.where(empty, torch.full_like(cx, (width - 1) / 2), cx)
    return torch.stack([cy, cx], dim=-1)


def window_corners(centroids: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Top-left corners ``[N, 2]`` of the 8x8 windows centred (to the nearest pixel) on
    ``centroids``, shifted inwards where they would leave the frame."""
    # The window's centre sits between pixels 3 and 4, hence the 3.5.
    top = (centroids[:, 0] - (WINDOW - 1) / 2).round().long().clamp(0, height - WINDOW)
    left = (centroids[:, 1] - (WINDOW - 1) / 2).round().long().clamp(0, width - WINDOW)
    return torch.stack([top, left], dim=-1)


def window_masks(corners: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Boolean masks ``[N, H, W]`` of the 8x8 windows with top-left ``corners`` ``[N, 2]``."""
    rows = torch.arange(height, device=corners.device)[None, :, None]
    cols = torch.arange(width, device=corners.device)[None, None, :]
    top, left = corners[:, 0, None, None], corners[:, 1, None, None]
    return (rows >= top) & (rows < top + WINDOW) & (cols >= left) & (cols < left + WINDOW)


def centred_windows(frames: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """The ``8 x 8`` windows ``[N, 1, 8, 8]`` of frames ``[N, H, W]`` centred (to the nearest
    pixel) on ``centroids`` ``[N, 2]``, shifted inwards where they would leave the frame."""
    n, height, width = frames.shape
    corners = window_corners(centroids, height, width)
    patches = F.unfold(frames[:, None], WINDOW)  # [N, 64, L], L = (H - 7) * (W - 7)
    index = corners[:, 0] * (width - WINDOW + 1) + corners[:, 1]
    index = index[:, None, None].expand(n, WINDOW * WINDOW, 1)
    return patches.gather(2, index).reshape(n, 1, WINDOW, WINDOW)


def locate_digits(frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the digit of each frame ``[N, H, W]`` is: the centroid ``[N, 2]`` of the ink (pixels
    of at least ``INK``) inside its window, and the window's top-left corner ``[N, 2]``.

    The window starts on the centroid of all the frame's ink and moves once onto the centroid
    of the ink inside it, so ink far from the digit stops pulling it."""
    _, height, width = frames.shape
    corners = window_corners(ink_centroids(frames, INK), height, width)
    inside = torch.where(window_masks(corners, height, width), frames, torch.zeros_like(frames))
    centroids = ink_centroids(inside, INK)
    corners = window_corners(centroids, height, width)
    inside = torch.where(window_masks(corners, height, width), frames, torch.zeros_like(frames))
    return ink_centroids(inside, INK), corners


def motion_scores(
    starts: torch.Tensor, ends: torch.Tensor, steps: torch.Tensor, expected_travel: float
) -> torch.Tensor:
    """``[B]`` motion scores of the digit moving from ``starts`` to ``ends`` ``[B, 2]`` (row,
    col) against unit steps ``[B, 2]`` (dy, dx): ``clip((d . u - |d x u|) / expected_travel, 0,
    1)`` with ``d = ends - starts``."""
    d = ends - starts
    along = (d * steps).sum(-1)
    across = (d[:, 0] * steps[:, 1] - d[:, 1] * steps[:, 0]).abs()
    return ((along - across) / expected_travel).clamp(0.0, 1.0)


def speckle_fractions(frames: torch.Tensor) -> torch.Tensor:
    """``[N]`` fraction of background pixels brighter than ``FAINT`` in frames ``[N, H, W]``; the
    background is every pixel outside the bounding box, grown by one pixel, of the pixels
    brighter than ``STROKE`` (all of the frame when there are none)."""
    _, height, width = frames.shape
    strokes = frames > STROKE
    rows, cols = strokes.any(dim=2), strokes.any(dim=1)  # [N, H], [N, W]
    row_index = torch.arange(height, device=frames.device).expand_as(rows)
    col_index = torch.arange(width, device=frames.device).expand_as(cols)
    top = torch.where(rows, row_index, height).min(dim=1).values - 1
    bottom = torch.where(rows, row_index, -1).max(dim=1).values + 1
    left = torch.where(cols, col_index, width).min(dim=1).values - 1
    right = torch.where(cols, col_index, -1).max(dim=1).values + 1
    in_rows = (row_index >= top[:, None]) & (row_index <= bottom[:, None])
    in_cols = (col_index >= left[:, None]) & (col_index <= right[:, None])
    box = in_rows[:, :, None] & in_cols[:, None, :]  # empty when no pixel is a stroke
    background = ~box
    bright = (frames > FAINT) & background
    return bright.sum(dim=(1, 2)).float() / background.sum(dim=(1, 2)).clamp_min(1).float()


def _check_videos(name: str, outputs: torch.Tensor) -> None:
    if outputs.ndim != 5 or outputs.shape[2] != 1 or min(outputs.shape[3:]) < WINDOW:
        raise ValueError(
            f"{name}: expected grey videos [B, F, 1, H, W] (H, W >= 8) in [0, 1], "
            f"got {tuple(outputs.shape)}"
        )
    if outputs.shape[1] < 2:
        raise ValueError(f"{name}: a clip needs at least 2 frames to move")


class MovingDigitReward(RewardModel):
    """Scores clips ``[B, F, 1, H, W]`` in ``[0, 1]`` against prompts like "a 3 moving left".

    Returns ``moving_digit`` (primary), ``digit``, ``motion``, ``tidy`` and ``accuracy``
    (fraction of frames whose window the classifier reads as the prompt's digit).

    Args:
        path: window-classifier safetensors (a ``DigitClassifier``, 10 or 11 classes); None
            uses the embedded video classifier.
        device: where to run the classifier.
        speed: expected pixels per frame (the embedded clips move 1).
        digit_weight: weight of ``digit`` against ``motion`` in the primary score.
    """

    name = "moving_digit"
    accepts = ("videos",)

    def __init__(
        self,
        path: str | None = None,
        device: str | torch.device = "cpu",
        speed: float = 1.0,
        digit_weight: float = 0.5,
        tidy_power: float = 1.0,
    ) -> None:
        if tidy_power < 0:
            raise ValueError(f"{self.name}: tidy_power must be >= 0, got {tidy_power}")
        if speed <= 0:
            raise ValueError(f"{self.name}: speed must be positive, got {speed}")
        if not 0.0 <= digit_weight <= 1.0:
            raise ValueError(f"{self.name}: digit_weight must be in [0, 1], got {digit_weight}")
        self.path = path
        self.device = torch.device(device)
        self.speed = speed
        self.digit_weight = digit_weight
        self.tidy_power = tidy_power
        self._model: torch.nn.Module | None = None

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            from tasks.video_digits import load_video_classifier

            self._model = load_video_classifier(self.path).to(self.device).eval()
        return self._model

    @torch.no_grad()
    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        _check_videos(self.name, outputs)
        videos = outputs.float().to(self.device)
        batch, frames, _, height, width = videos.shape
        digits, steps = _labels(prompts, self.device)
        flat = videos.reshape(batch * frames, height, width)
        centroids, corners = locate_digits(flat)
        inside = torch.where(window_masks(corners, height, width), flat, torch.zeros_like(flat))
        tidy_frames = inside.sum(dim=(1, 2)) / flat.sum(dim=(1, 2)).clamp_min(1e-6)
        tidy = torch.where(flat.sum(dim=(1, 2)) < 1e-6, 1.0, tidy_frames)
        tidy = tidy.reshape(batch, frames).mean(1)
        windows = centred_windows(flat, centroids)
        probs = self.model(windows).softmax(-1).reshape(batch, frames, -1)
        digit, accuracy = _digit_scores(probs, digits)
        path = centroids.reshape(batch, frames, 2)
        motion = motion_scores(path[:, 0], path[:, -1], steps, self.speed * (frames - 1))
        primary = tidy**self.tidy_power * (
            self.digit_weight * digit + (1.0 - self.digit_weight) * motion
        )
        scores = {
            self.name: primary,
            "digit": digit,
            "motion": motion,
            "tidy": tidy,
            "accuracy": accuracy,
        }
        return RewardOutput({k: v.cpu() for k, v in scores.items()})


class MovingDigitJudge(RewardModel):
    """Held-out second opinion on clips ``[B, F, 1, H, W]``: ``moving_digit_judge`` (primary, the
    judge's probability of the prompt's digit averaged over frames), ``accuracy`` (fraction of
    frames it reads as that digit) and ``speckle`` (``speckle_fractions`` averaged over frames).
    Meant to be logged at weight 0 beside ``moving_digit``, never trained against.

    Args:
        path: ``FrameDigitJudge`` safetensors; None uses the embedded judge.
        device: where to run it.
    """

    name = "moving_digit_judge"
    accepts = ("videos",)

    def __init__(self, path: str | None = None, device: str | torch.device = "cpu") -> None:
        self.path = path
        self.device = torch.device(device)
        self._model: torch.nn.Module | None = None

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            from tasks.video_digits import load_video_judge

            self._model = load_video_judge(self.path).to(self.device).eval()
        return self._model

    @torch.no_grad()
    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        _check_videos(self.name, outputs)
        videos = outputs.float().to(self.device)
        batch, frames, _, height, width = videos.shape
        digits, _ = _labels(prompts, self.device)
        flat = videos.reshape(batch * frames, 1, height, width)
        probs = self.model(flat).softmax(-1).reshape(batch, frames, -1)
        digit, accuracy = _digit_scores(probs, digits)
        speckle = speckle_fractions(flat[:, 0]).reshape(batch, frames).mean(1)
        scores = {self.name: digit, "accuracy": accuracy, "speckle": speckle}
        return RewardOutput({k: v.cpu() for k, v in scores.items()})


def _digit_scores(probs: torch.Tensor, digits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From per-frame class probabilities ``[B, F, C]`` and the prompts' digits ``[B]``: the
    prompt digit's probability averaged over frames ``[B]``, and the fraction of frames whose
    most likely class is that digit ``[B]``."""
    batch, frames, _ = probs.shape
    target = probs.gather(2, digits[:, None, None].expand(batch, frames, 1)).squeeze(2)
    return target.mean(1), (probs.argmax(-1) == digits[:, None]).float().mean(1)


def _labels(prompts: list[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Digit labels ``[B]`` and unit steps ``[B, 2]`` (dy, dx) named by the prompts."""
    from tasks.video_digits import DIRECTION_STEPS, parse_video_prompt

    parsed = {p: parse_video_prompt(p) for p in dict.fromkeys(prompts)}  # groups repeat
    digits = torch.tensor([parsed[p][0] for p in prompts], device=device)
    steps = torch.tensor([DIRECTION_STEPS[parsed[p][1]] for p in prompts], dtype=torch.float32)
    return digits, steps.to(device)
