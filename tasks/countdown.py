"""Countdown: combine three small numbers with ``+ - * /`` and parentheses to hit a target.

This is genrl's embedded text task for GRPO on a tiny causal LM (``genrl/assets/countdown_lm``).
The reward is verifiable from strings alone, so RL needs no reward model, and the task is small
enough for a character-level transformer trained on a CPU in minutes.

Formats (exact strings; the model sees them character by character):

* prompt: ``"Use 3 5 7 to make 22:"`` -- the numbers in a random order, then the target; the
  trailing ``":"`` is the separator, the completion follows with no space.
* completion: ``"3*5+7"`` followed by the tokenizer's ``<eos>`` token. Spaces inside the equation
  are tolerated, anything else around it (text, ``"="``, a second line) makes it malformed. A
  literal ``"<eos>"`` (completions decoded without ``skip_special_tokens``) ends the completion.

Problems: numbers are drawn uniformly from ``NUMBER_RANGE`` (repeats allowed); the target is the
value of a uniformly drawn expression that uses each number exactly once with ``+ - *`` and
parentheses, kept when it lies in ``TARGET_RANGE``. So every problem has at least one solution
without division (``Problem.solution``).

Division: completions may use ``/``. Equations are evaluated exactly with ``Fraction``, so
``"8/4*3"`` makes 6 while ``"7/2*2"`` makes 7 (no rounding); a division by zero is a well-formed
but wrong equation. Generated targets never need division.

Splits: a problem belongs to ``"heldout"`` when the sha256 of its sorted numbers and target is
divisible by ``HELDOUT_MODULUS``, otherwise to ``"train"`` -- a pure function of the problem, so
the splits can never overlap, whatever seed or size is asked for.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from itertools import permutations, product
from typing import Any

NUMBER_RANGE = (1, 9)
TARGET_RANGE = (1, 99)
NUM_NUMBERS = 3
HELDOUT_MODULUS = 5  # one problem in five is held out
# Distinct problems of each split with the ranges above (``make_problems`` finds them all).
TRAIN_PROBLEMS = 1505
HELDOUT_PROBLEMS = 359
SPLITS = ("train", "heldout")
EOS_TEXT = "<eos>"
# Longest reference solution: three numbers, two operators and one pair of parentheses
# ("(9-8)*7", 7 characters for single-digit numbers). Sample MAX_COMPLETION_CHARS + 1 new tokens
# (room for <eos>); a correct equation never needs more.
MAX_COMPLETION_CHARS = NUM_NUMBERS * len(str(NUMBER_RANGE[1])) + (NUM_NUMBERS - 1) + 2
# Completions longer than this are malformed without being parsed (bounds the parser's work).
MAX_EQUATION_CHARS = 64

CORRECT_REWARD = 1.0
WELL_FORMED_REWARD = 0.1

_OPS = ("+", "-", "*")
_PROMPT_RE = re.compile(r"Use ((?:\d+ )+)to make (\d+)")
_ALLOWED_CHARS_RE = re.compile(r"[0-9+\-*/() ]+")


@dataclass(frozen=True)
class Problem:
    """One Countdown instance; ``solution`` is a reference equation (not the only one)."""

    numbers: tuple[int, ...]
    target: int
    solution: str

    @property
    def prompt(self) -> str:
        return format_prompt(self.numbers, self.target)


def format_prompt(numbers: Sequence[int], target: int) -> str:
    """The prompt string; it alone carries everything ``countdown_reward`` needs."""
    return f"Use {' '.join(str(n) for n in numbers)} to make {target}:"


def format_chat_prompt(numbers: Sequence[int], target: int) -> str:
    """The instruction-style prompt for chat models; the answer goes inside answer tags."""
    return (
        f"{format_prompt(numbers, target)[:-1]}. Use each number exactly once with + - * / and "
        "parentheses. Reply with the expression only, inside <answer></answer>, for example "
        "<answer>(1+2)*3</answer>."
    )


def answer_in_tags(completion: str) -> str | None:
    """The text of the last ``<answer>...</answer>`` in a completion, or None."""
    matches = re.findall(r"<answer>(.*?)</answer>", completion, flags=re.DOTALL)
    return matches[-1] if matches else None


def parse_prompt(prompt: str | list[dict[str, Any]]) -> tuple[tuple[int, ...], int]:
    """``(numbers, target)`` of a prompt (also found inside chat messages); ValueError if none."""
    match = _PROMPT_RE.search(_as_text(prompt, last_only=False))
    if match is None:
        raise ValueError(f"not a Countdown prompt: {prompt!r}")
    numbers = tuple(int(n) for n in match.group(1).split())
    return numbers, int(match.group(2))


def split_of(numbers: Sequence[int], target: int) -> str:
    """``"train"`` or ``"heldout"``: a hash of the sorted numbers and target decides."""
    key = ",".join(str(n) for n in sorted(numbers)) + f"={target}"
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "heldout" if digest % HELDOUT_MODULUS == 0 else "train"


def _format(a: str, o1: str, b: str, o2: str, c: str, left: bool) -> str:
    """``(a o1 b) o2 c`` (left) or ``a o1 (b o2 c)`` with only the parentheses that matter."""
    if left:
        inner = f"({a}{o1}{b})" if o1 in "+-" and o2 == "*" else f"{a}{o1}{b}"
        return f"{inner}{o2}{c}"
    needs = o2 in "+-" and o1 in "*-"
    inner = f"({b}{o2}{c})" if needs else f"{b}{o2}{c}"
    return f"{a}{o1}{inner}"


def _apply(x: int, op: str, y: int) -> int:
    return x + y if op == "+" else x - y if op == "-" else x * y


@lru_cache(maxsize=4096)
def _expressions_sorted(numbers: tuple[int, ...]) -> tuple[tuple[str, int], ...]:
    found: dict[str, int] = {}
    for a, b, c in permutations(numbers):
        for o1, o2 in product(_OPS, repeat=2):
            sa, sb, sc = str(a), str(b), str(c)
            found.setdefault(_format(sa, o1, sb, o2, sc, True), _apply(_apply(a, o1, b), o2, c))
            found.setdefault(_format(sa, o1, sb, o2, sc, False), _apply(a, o1, _apply(b, o2, c)))
    return tuple(sorted(found.items()))


def expressions(numbers: Sequence[int]) -> tuple[tuple[str, int], ...]:
    """Every distinct ``(equation, value)`` using each of three numbers once with ``+ - *``."""
    if len(numbers) != NUM_NUMBERS:
        raise ValueError(f"expected {NUM_NUMBERS} numbers, got {list(numbers)}")
    return _expressions_sorted(tuple(sorted(numbers)))


def make_problems(n: int, seed: int, split: str = "train") -> list[Problem]:
    """``n`` distinct problems of one split, the same list for the same ``(n, seed, split)``.

    Distinct means no two share sorted numbers and target. Raises when the split runs out of
    distinct problems (with the default ranges: ``TRAIN_PROBLEMS``, ``HELDOUT_PROBLEMS``).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(seed)
    low, high = TARGET_RANGE
    seen: set[tuple[tuple[int, ...], int]] = set()
    problems: list[Problem] = []
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > 200 * n + 10_000:
            raise ValueError(f"only {len(problems)} distinct {split} problems found, asked {n}")
        numbers = tuple(rng.randint(*NUMBER_RANGE) for _ in range(NUM_NUMBERS))
        solution, target = rng.choice(expressions(numbers))
        key = (tuple(sorted(numbers)), target)
        if not low <= target <= high or key in seen or split_of(numbers, target) != split:
            continue
        seen.add(key)
        problems.append(Problem(numbers=numbers, target=target, solution=solution))
    return problems


@dataclass(frozen=True)
class Equation:
    """A parsed completion: its number literals in order and exact value (None: division by 0)."""

    numbers: tuple[int, ...]
    value: Fraction | None


def _evaluate(node: ast.AST, numbers: list[int]) -> Fraction | None:
    """Exact value of an allowed node (None after a division by zero); ValueError otherwise."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        numbers.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _evaluate(node.left, numbers), _evaluate(node.right, numbers)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        return None if right == 0 else left / right
    raise ValueError(f"disallowed syntax: {type(node).__name__}")


def parse_equation(text: str) -> Equation | None:
    """Parse an equation safely (``ast``, never ``eval``); None when malformed.

    Allowed: non-negative integer literals, binary ``+ - * /``, parentheses and spaces. Unary
    minus, ``//``, ``**``, names, calls and anything else make the text malformed; so does a
    character outside ``0-9+-*/() `` (checked before parsing) or more than 64 characters.
    """
    text = text.strip()
    if len(text) > MAX_EQUATION_CHARS or not _ALLOWED_CHARS_RE.fullmatch(text):
        return None
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    numbers: list[int] = []
    try:
        value = _evaluate(tree.body, numbers)
    except ValueError:
        return None
    return Equation(numbers=tuple(numbers), value=value)


def _as_text(value: str | list[dict[str, Any]], last_only: bool = True) -> str:
    """A plain string, or the content of chat messages (the last one for completions)."""
    if isinstance(value, str):
        return value
    contents = [str(message.get("content", "")) for message in value]
    if last_only:
        return contents[-1] if contents else ""
    return "\n".join(contents)


def completion_equation(completion: str | list[dict[str, Any]]) -> str:
    """The equation text of a completion: cut at a literal ``<eos>``, surrounding space removed."""
    return _as_text(completion).split(EOS_TEXT, 1)[0].strip()


def score(prompt: str | list[dict[str, Any]], completion: str | list[dict[str, Any]]) -> float:
    """1.0 correct, 0.1 well-formed but wrong, 0.0 malformed (see ``countdown_reward``)."""
    numbers, target = parse_prompt(prompt)
    equation = parse_equation(completion_equation(completion))
    if equation is None:
        return 0.0
    if (
        equation.value is not None
        and equation.value == target
        and sorted(equation.numbers) == sorted(numbers)
    ):
        return CORRECT_REWARD
    return WELL_FORMED_REWARD


def is_correct(prompt: str | list[dict[str, Any]], completion: str | list[dict[str, Any]]) -> bool:
    """True when the completion uses exactly the prompt's numbers, each once, to make the target."""
    return score(prompt, completion) == CORRECT_REWARD


def countdown_reward(
    prompts: Sequence[str | list[dict[str, Any]]],
    completions: Sequence[str | list[dict[str, Any]]],
    **kwargs: Any,
) -> list[float]:
    """TRL-style reward function: one float per (prompt, completion) pair.

    1.0 for a correct equation (exactly the given numbers, each once, equal to the target), 0.1
    for a well-formed but wrong one -- a small shaping bonus so a group of failures still prefers
    parseable output -- and 0.0 for anything malformed. Extra keyword arguments (TRL passes
    dataset columns) are ignored: the prompt alone defines the problem.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    return [score(p, c) for p, c in zip(prompts, completions, strict=True)]
