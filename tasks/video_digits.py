"""Text prompts of the embedded video task ("a 3 moving left") and parsing them back to labels."""

from __future__ import annotations

import re

from tasks.digits import DIGIT_WORDS, parse_prompt

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
