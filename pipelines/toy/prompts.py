"""Text prompts for the embedded digits task, and parsing them back to class labels."""

from __future__ import annotations

import re

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
