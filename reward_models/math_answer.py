"""A verifiable math reward: the response's last ``\\boxed{...}`` against the row's answer, plus a
format check, in EasyR1's form.

EasyR1's ``examples/reward_function/math.py`` (hiyouga/EasyR1 at b44b311): spaces around
``<``, ``>`` and ``/`` are removed first; ``format`` is 1 when the whole response matches
``<think>.*</think>.*\\boxed\\{.*\\}.*`` (dot matches newlines); ``accuracy`` is 1 when
``mathruler``'s ``grade_answer`` accepts the boxed content for the ground truth; the reward is
``(1 - format_weight) * accuracy + format_weight * format`` with ``format_weight`` 0.1.

``mathruler`` is not in genrl's stack, so ``answers_match`` is genrl's own, smaller grader:
equal after normalising LaTeX spellings (``\\left``/``\\right``, ``\\dfrac``, ``\\text{..}``,
spaces, ``$``, degrees, a trailing period), or equal as numbers (integers, decimals, ``a/b``
and ``\\frac{a}{b}``, with relative tolerance 1e-6). It does not prove symbolic equivalence
(``2\\sqrt{2}`` against ``\\sqrt{8}`` is a miss).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import torch

from reward_models.base import RewardModel, RewardOutput

FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
FORMAT_INSTRUCTION = (
    "You FIRST think about the reasoning process as an internal monologue and then provide the "
    "final answer. The reasoning process MUST BE enclosed within <think> </think> tags. The "
    "final answer MUST BE put in \\boxed{}."
)
"""EasyR1's ``examples/format_prompt/math.jinja`` sentence, appended to each problem."""


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces matched), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            if depth == 0:
                return text[begin:index]
            depth -= 1
    return None


def normalise(answer: str) -> str:
    """A canonical spelling of a short math answer."""
    text = answer.strip().strip("$").strip()
    text = re.sub(r"\\text\{([^{}]*)\}", r"\1", text)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac")):
        text = text.replace(old, new)
    text = re.sub(r"\^\{?\\circ\}?|°|\\!|\\,|\\;|\s+", "", text)
    return text.rstrip(".")


def as_number(text: str) -> Fraction | float | None:
    """An integer, decimal, ``a/b`` or ``\\frac{a}{b}`` as a number, else None."""
    match = re.fullmatch(r"\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", text)
    if match:
        text = f"{match.group(1)}/{match.group(2)}"
    try:
        return Fraction(text) if "/" in text or re.fullmatch(r"-?\d+", text) else float(text)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(answer: str | None, truth: str) -> bool:
    """Whether a boxed answer grades as the ground truth (module docstring)."""
    if answer is None:
        return False
    left, right = normalise(answer), normalise(truth)
    if left == right:
        return True
    a, b = as_number(left), as_number(right)
    if a is None or b is None:
        return False
    return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))


class MathBoxedReward(RewardModel):
    """``(1 - format_weight) * accuracy + format_weight * format`` per response; the ground
    truth is each row's ``answer`` column (``metadata``).

    Args:
        format_weight: weight of the ``<think>...</think>...\\boxed{}`` format check (EasyR1:
            0.1).
        answer_column: the metadata key holding the ground truth.
    """

    name = "math_boxed"
    accepts = ("texts",)

    def __init__(self, format_weight: float = 0.1, answer_column: str = "answer") -> None:
        if not 0 <= format_weight <= 1:
            raise ValueError(f"math_boxed: format_weight must lie in [0, 1], got {format_weight}")
        self.format_weight, self.answer_column = format_weight, answer_column

    def score(
        self, outputs: list[str], prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        if metadata is None or any(self.answer_column not in m for m in metadata):
            raise ValueError(
                f"math_boxed needs each prompt's {self.answer_column!r} column (a JSONL dataset "
                "row or a Prompt with that column)"
            )
        formats, accuracies = [], []
        for response, row in zip(outputs, metadata, strict=True):
            response = re.sub(r"\s*(<|>|/)\s*", r"\1", response)
            formats.append(float(FORMAT.fullmatch(response) is not None))
            truth = str(row[self.answer_column])
            accuracies.append(float(answers_match(last_boxed(response), truth)))
        accuracy, fmt = torch.tensor(accuracies), torch.tensor(formats)
        overall = (1 - self.format_weight) * accuracy + self.format_weight * fmt
        return RewardOutput({self.name: overall, "accuracy": accuracy, "format": fmt})


__all__ = ["FORMAT_INSTRUCTION", "MathBoxedReward", "answers_match", "last_boxed"]
