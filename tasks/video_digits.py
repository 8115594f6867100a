"""The embedded video task: its text prompts ("a 3 moving left"), parsing them back to labels,
and its two digit classifiers (weights in ``genrl/assets/video_digits/``, rebuilt by
``python scripts/build_video_assets.py``):

- the reward's classifier, a ``DigitClassifier`` with an eleventh class, "no single digit"
  (speckle, noise, blends of two digits), read on the 8x8 window around a frame's ink;
- the judge, ``FrameDigitJudge``, another architecture trained on other data (whole clean
  16x16 frames with the digit anywhere), never trained against: a held-out second opinion.
"""

from __future__ import annotations

import os
import re

import torch
import torch.nn.functional as F
from torch import nn

from loading.assets import load_model, resolve_weights
from tasks.digits import DIGIT_WORDS, DigitClassifier, parse_prompt

EMBEDDED_VIDEO_CLASSIFIER = "video_digits/digit_classifier.safetensors"
EMBEDDED_VIDEO_JUDGE = "video_digits/digit_judge.safetensors"
NO_DIGIT = 10
"""The reward classifier's extra class: not one legible digit."""

# Index order is the model's direction label; ``DIRECTION_STEPS[k]`` is its (dy, dx) per frame in
# image coordinates (rows grow downwards).
DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down")
DIRECTION_STEPS: tuple[tuple[int, int], ...] = ((0, -1), (0, 1), (-1, 0), (1, 0))

# ``{d}`` is the digit character, ``{word}`` its English name, ``{direction}`` one of DIRECTIONS.
VIDEO_TEMPLATES: tuple[str, ...] = (
    "a {d} moving {direction}",
    "the digit {word} moving {direction}",
    "a handwritten {word} sliding {direction}",
    "the number {word} heading {direction}",
)
VIDEO_TRAIN_TEMPLATES: tuple[int, ...] = (0, 1, 2)
"""The templates training uses."""
VIDEO_HELDOUT_TEMPLATE = 3
"""The template of the held-out prompts, a wording no training prompt uses (the embedded model
reads only the two labels, so for it the held-out part is the evaluation's noise seeds)."""

_DIRECTION = re.compile(r"\b(" + "|".join(DIRECTIONS) + r")\b", re.IGNORECASE)


def video_prompt_for(digit: int, direction: int, template: int = 0) -> str:
    """Prompt for ``digit`` (0..9) moving in ``DIRECTIONS[direction]``."""
    if not 0 <= int(digit) <= 9:
        raise ValueError(f"digit must be 0..9, got {digit}")
    if not 0 <= int(direction) < len(DIRECTIONS):
        raise ValueError(f"direction must be in 0..{len(DIRECTIONS) - 1}, got {direction}")
    if not 0 <= template < len(VIDEO_TEMPLATES):
        raise ValueError(f"template must be in 0..{len(VIDEO_TEMPLATES) - 1}, got {template}")
    return VIDEO_TEMPLATES[template].format(
        d=int(digit), word=DIGIT_WORDS[int(digit)], direction=DIRECTIONS[int(direction)]
    )


def parse_video_prompt(prompt: str) -> tuple[int, int]:
    """``(digit, direction)`` named by ``prompt``: exactly one digit (character or word, as
    ``parse_prompt`` reads it) and exactly one of ``left/right/up/down``; otherwise ValueError."""
    found = {m.group().lower() for m in _DIRECTION.finditer(prompt)}
    if len(found) != 1:
        what = "no direction" if not found else f"several directions {sorted(found)}"
        raise ValueError(
            f"prompt {prompt!r} names {what}; it must name exactly one of "
            f"{', '.join(DIRECTIONS)} (e.g. 'a 3 moving left')"
        )
    direction = found.pop()
    return parse_prompt(_DIRECTION.sub(" ", prompt)), DIRECTIONS.index(direction)


VIDEO_EVAL_PROMPTS: list[str] = [
    video_prompt_for(d, k, VIDEO_HELDOUT_TEMPLATE)
    for k in range(len(DIRECTIONS))
    for d in range(len(DIGIT_WORDS))
]
"""Held-out prompts: every (digit, direction) pair in the held-out template (40 prompts, in the
order of the labels the embedded assets' manifest was measured on)."""

VIDEO_TRAIN_PROMPTS: list[str] = [
    video_prompt_for(d, k, t)
    for t in VIDEO_TRAIN_TEMPLATES
    for k in range(len(DIRECTIONS))
    for d in range(len(DIGIT_WORDS))
]
"""Training prompts: every (digit, direction) pair in the training templates (120 prompts)."""


class FrameDigitJudge(nn.Module):
    """MLP on a whole ``size x size`` frame: ``[B, 1, size, size]`` in ``[0, 1]`` -> logits
    ``[B, 10]``. It reads the frame as it is, with no window cut around the ink, so it shares
    neither the reward classifier's architecture nor its input; no dropout or batch norm."""

    def __init__(self, size: int = 16, hidden_dim: int = 256, num_classes: int = 10) -> None:
        super().__init__()
        self.size, self.hidden_dim, self.num_classes = size, hidden_dim, num_classes
        self.fc1 = nn.Linear(size * size, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)
        self.fc3 = nn.Linear(hidden_dim, num_classes)

    @property
    def config(self) -> dict[str, int]:
        """Constructor kwargs (what the safetensors metadata stores)."""
        return {"size": self.size, "hidden_dim": self.hidden_dim, "num_classes": self.num_classes}

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        if frames.ndim != 4 or tuple(frames.shape[1:]) != (1, self.size, self.size):
            raise ValueError(
                f"frames must be [B, 1, {self.size}, {self.size}] in [0, 1], "
                f"got {tuple(frames.shape)}"
            )
        h = F.relu(self.fc1(frames.flatten(1).to(self.fc1.weight.dtype)))
        return self.fc3(F.relu(self.fc2(h)))


def load_video_classifier(path: str | os.PathLike | None = None) -> DigitClassifier:
    """The reward's 11-class window classifier (the embedded one when ``path`` is None)."""
    return load_model(DigitClassifier, resolve_weights(path, EMBEDDED_VIDEO_CLASSIFIER))


def load_video_judge(path: str | os.PathLike | None = None) -> FrameDigitJudge:
    """The held-out judge (the embedded one when ``path`` is None): CPU, float32, eval."""
    return load_model(FrameDigitJudge, resolve_weights(path, EMBEDDED_VIDEO_JUDGE))
