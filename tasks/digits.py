"""The embedded digits task: its text prompts, parsing them back to class labels, and the tiny
classifier that judges a generated 8x8 digit (the reward's network; weights in
``genrl/assets/``, rebuilt by ``python scripts/build_assets.py``)."""

from __future__ import annotations

import os
import re

import torch
import torch.nn.functional as F
from torch import nn

from loading.assets import load_model, resolve_weights

IMAGE_SIZE = 8
"""Side of the task's square grey images (scikit-learn's digits)."""

DIGIT_WORDS: tuple[str, ...] = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
)

# ``{word}`` is the digit's English name, ``{d}`` the digit character.
TEMPLATES: tuple[str, ...] = (
    "a handwritten digit {word}",
    "the number {d}",
    "a hand-drawn {word}",
    "an 8x8 picture of the digit {d}",
)

# Digit runs are matched whole so that "12" is reported as a multi-digit number, not as 1 and 2.
# The "8x8" of a template is ignored by stripping it before matching.
_SIZE_TOKEN = re.compile(r"\b8\s*x\s*8\b", re.IGNORECASE)
_NUMBER = re.compile(r"\d+")
_WORD = re.compile(r"\b(" + "|".join(DIGIT_WORDS) + r")\b", re.IGNORECASE)


def prompt_for(label: int, template: int = 0) -> str:
    """Prompt for digit ``label`` (0..9) using ``TEMPLATES[template]``."""
    if not 0 <= int(label) <= 9:
        raise ValueError(f"label must be a digit 0..9, got {label}")
    if not 0 <= template < len(TEMPLATES):
        raise ValueError(f"template must be in 0..{len(TEMPLATES) - 1}, got {template}")
    return TEMPLATES[template].format(word=DIGIT_WORDS[int(label)], d=int(label))


def parse_prompt(prompt: str) -> int:
    """Label 0..9 named by ``prompt``: a digit character or digit word anywhere, any case.

    Repeating the same digit ("seven (7)") is fine; naming two different digits, a multi-digit
    number, or none at all raises ``ValueError``.
    """
    accepted = (
        "accepted forms: a single digit character 0-9 or one of the words "
        + ", ".join(DIGIT_WORDS)
        + ' (e.g. "a handwritten digit seven", "the number 7")'
    )
    text = _SIZE_TOKEN.sub(" ", prompt)
    found: set[int] = set()
    for match in _NUMBER.finditer(text):
        if len(match.group()) > 1:
            raise ValueError(
                f"prompt {prompt!r} contains the multi-digit number {match.group()!r}; {accepted}"
            )
        found.add(int(match.group()))
    for match in _WORD.finditer(text):
        found.add(DIGIT_WORDS.index(match.group().lower()))
    if not found:
        raise ValueError(f"prompt {prompt!r} names no digit; {accepted}")
    if len(found) > 1:
        raise ValueError(
            f"prompt {prompt!r} names several different digits {sorted(found)}; "
            f"it must name exactly one ({accepted})"
        )
    return found.pop()


TRAIN_TEMPLATES: tuple[int, ...] = (0, 1, 2)
"""The templates training uses."""
HELDOUT_TEMPLATE = 3
"""The template of the held-out prompts, a wording no training prompt uses. The embedded
generator and classifier read only the digit label, so for them the wording changes nothing:
what is held out for the model are the evaluation's noise seeds."""

ALL_PROMPTS: list[str] = [prompt_for(label, HELDOUT_TEMPLATE) for label in range(10)]
"""The held-out prompts of the digits task: one per digit, in the held-out template."""

TRAIN_PROMPTS: list[str] = [
    prompt_for(d, t) for t in TRAIN_TEMPLATES for d in range(len(DIGIT_WORDS))
]
"""The training prompts of the digits task: every digit in the training templates."""


EMBEDDED_CLASSIFIER = "digit_classifier.safetensors"


class DigitClassifier(nn.Module):
    """Tiny CNN: images ``[B, 1, 8, 8]`` in ``[0, 1]`` -> logits ``[B, 10]``.


    Trained with light augmentation (gaussian noise, +-1 pixel shifts) so it is usable as a reward
    model on generated samples. No dropout or batch norm.
    """

    def __init__(self, channels: int = 16, hidden_dim: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        self.channels = channels
        self.hidden_dim = hidden_dim
        self.num_classes = num_classes
        self.conv1 = nn.Conv2d(1, channels, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(2 * channels * (IMAGE_SIZE // 2) ** 2, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, num_classes)

    @property
    def config(self) -> dict[str, int]:
        """Constructor kwargs (what the safetensors metadata stores)."""
        return {
            "channels": self.channels,
            "hidden_dim": self.hidden_dim,
            "num_classes": self.num_classes,
        }

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or tuple(images.shape[1:]) != (1, IMAGE_SIZE, IMAGE_SIZE):
            raise ValueError(f"images must be [B, 1, 8, 8] in [0, 1], got {tuple(images.shape)}")
        h = F.relu(self.conv1(images.to(self.conv1.weight.dtype)))
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


def load_classifier(path: str | os.PathLike | None = None) -> DigitClassifier:
    """Load a ``DigitClassifier`` (the embedded one when ``path`` is None): CPU, float32, eval."""
    return load_model(DigitClassifier, resolve_weights(path, EMBEDDED_CLASSIFIER))
