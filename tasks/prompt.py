"""``Prompt``: the prompt every task and dataset hands to a policy and its rewards.

A prompt is its text plus the other columns of its row (pictures for a vision-language policy, a
ground-truth answer for a reward), so the core can keep passing ``list[str]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Prompt(str):
    """A prompt's text together with the other columns of its dataset row: ``images`` that a
    vision-language policy reads, ``answer`` or ``rubric`` that a reward reads, and the row's
    index, since rows may share a text ("Find x.") and differ in their images.


    It is a ``str``, so text-level code (formatting, logs) treats it as its text; code that
    keeps per-prompt state (trackers, per-prompt tables, caches) keys it by ``prompt_id``,
    which tells rows apart. A plain ``str`` is a prompt without columns.
    """

    columns: dict[str, Any]
    row: int | None

    def __new__(
        cls, text: str, columns: Mapping[str, Any] | None = None, row: int | None = None
    ) -> Prompt:
        prompt = super().__new__(cls, text)
        prompt.columns = dict(columns or {})
        prompt.row = row
        return prompt

    def __reduce__(self) -> tuple[Any, ...]:  # keeps the columns through pickling
        return (Prompt, (str(self), self.columns, self.row))


def prompt_columns(prompt: str) -> dict[str, Any]:
    """The dataset columns a prompt carries (none for a plain ``str``)."""
    return getattr(prompt, "columns", {})


def prompt_id(prompt: str) -> str:
    """A plain ``str`` that identifies a prompt: its text, with ``#row`` for a dataset row (rows
    may share a text). Safe as a checkpointed dict key."""
    row = getattr(prompt, "row", None)
    return str(prompt) if row is None else f"{prompt} #{row}"
