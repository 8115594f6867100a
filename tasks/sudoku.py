"""4x4 Sudoku: fill the blank cells of a grid so rows, columns and 2x2 boxes each hold 1-4.

This is genrl's embedded task for RL on a tiny masked-diffusion LM (``genrl/assets/sudoku_dllm``,
LLaDA-style: a bidirectional transformer fills a fixed-length masked completion). The answer is
always exactly 16 characters, which suits a sampler that unmasks a fixed-length block, and the
reward is verifiable from strings alone, so RL needs no reward model.

Formats (exact strings; the model sees them character by character):

* prompt: ``"Sudoku 12.4 .4.2 2.43 4.2.:"`` -- ``"Sudoku "``, the 16 cells row-major in four rows
  of four separated by single spaces, ``"."`` for a blank, and the separator ``":"``. Always
  ``PROMPT_CHARS`` (27) characters.
* completion: the whole solved grid, row-major, no separators: ``"1234341221434321"``
  (``COMPLETION_CHARS`` = 16). Givens are repeated; they are not scored.

Correctness: only puzzles with exactly one solution are generated (checked against all 288 4x4
grids), so "the right digit for a cell" is well defined: the digit of that unique solution.
``parse_prompt`` rejects prompts whose givens allow zero or several solutions.

Reward: the fraction of the prompt's BLANK cells whose digit in the completion equals the
solution's (``sudoku_reward``). Whitespace is dropped and the text is cut at a literal ``"<eos>"``
before cells are read by position; other literal special tokens (e.g. ``"<mask>"`` left by a
sampler and decoded without ``skip_special_tokens``) count as one wrong cell each, so later cells
keep their positions. Characters past the 16th are ignored; a short completion scores only the
cells it has. Givens never count, so copying the prompt earns nothing.

Splits: a puzzle is ``"heldout"`` when the sha256 of its unique SOLUTION is divisible by
``HELDOUT_MODULUS``, otherwise ``"train"``. The split is a pure function of the puzzle, so splits
can never overlap; held-out puzzles also have solution grids that no train puzzle has, so a model
cannot pass them by recalling memorised grids.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import permutations
from typing import Any

SIZE = 4
CELLS = SIZE * SIZE
DIGITS = "1234"
BLANK = "."
PREFIX = "Sudoku "
SEPARATOR = ":"
PROMPT_CHARS = len(PREFIX) + CELLS + (SIZE - 1) + len(SEPARATOR)  # 27
COMPLETION_CHARS = CELLS  # 16
# Default difficulty: blanks drawn uniformly from this inclusive range (12 is the most a
# uniquely solvable 4x4 puzzle can have).
BLANKS = (9, 12)
HELDOUT_MODULUS = 5  # about one solution grid in five is held out
SPLITS = ("train", "heldout")
EOS_TEXT = "<eos>"

_PROMPT_RE = re.compile(r"Sudoku ([1-4.]{4}) ([1-4.]{4}) ([1-4.]{4}) ([1-4.]{4}):")
_SPECIAL_RE = re.compile(r"<[a-z]+>")


def _units() -> list[list[int]]:
    """Cell indices of the 4 rows, 4 columns and 4 boxes."""
    rows = [[r * SIZE + c for c in range(SIZE)] for r in range(SIZE)]
    cols = [[r * SIZE + c for r in range(SIZE)] for c in range(SIZE)]
    boxes = [
        [(br + r) * SIZE + bc + c for r in range(2) for c in range(2)]
        for br in (0, 2)
        for bc in (0, 2)
    ]
    return rows + cols + boxes


UNITS = _units()


@lru_cache(maxsize=1)
def solutions() -> tuple[str, ...]:
    """All 288 valid 4x4 grids as 16-character strings, sorted (row permutations, pruned)."""
    rows = ["".join(p) for p in permutations(DIGITS)]
    grids = [""]
    for _ in range(SIZE):  # extend every partial grid by each row that breaks no unit so far
        grids = [g + r for g in grids for r in rows if _consistent(g + r)]
    return tuple(sorted(grids))


def _consistent(partial: str) -> bool:
    """True when no row, column or box of a row-major partial grid repeats a digit."""
    for unit in UNITS:
        seen = [partial[i] for i in unit if i < len(partial)]
        if len(seen) != len(set(seen)):
            return False
    return True


def is_valid_grid(grid: str) -> bool:
    """True for a complete grid whose rows, columns and boxes each contain 1-4 exactly once."""
    if len(grid) != CELLS or any(ch not in DIGITS for ch in grid):
        return False
    return all(sorted(grid[i] for i in unit) == list(DIGITS) for unit in UNITS)


@lru_cache(maxsize=1)
def _cell_digit_masks() -> dict[tuple[int, str], int]:
    """Bit set (an int over the indices of ``solutions()``) of grids with digit d at cell i."""
    masks = dict.fromkeys(((i, d) for i in range(CELLS) for d in DIGITS), 0)
    for bit, grid in enumerate(solutions()):
        for i, d in enumerate(grid):
            masks[i, d] |= 1 << bit
    return masks


def completions_of(puzzle: str) -> tuple[str, ...]:
    """Every valid grid that agrees with the givens of a 16-cell puzzle (``"."`` = blank)."""
    masks, found = _cell_digit_masks(), (1 << len(solutions())) - 1
    for i, ch in enumerate(puzzle):
        if ch != BLANK:
            found &= masks.get((i, ch), 0)  # a character other than 1-4: no grid agrees
    return tuple(g for bit, g in enumerate(solutions()) if found >> bit & 1)


@dataclass(frozen=True)
class Problem:
    """One puzzle (16 cells, ``"."`` for blanks) and its unique solution."""

    puzzle: str
    solution: str

    @property
    def prompt(self) -> str:
        return format_prompt(self.puzzle)

    @property
    def blanks(self) -> int:
        return self.puzzle.count(BLANK)


def format_prompt(puzzle: str) -> str:
    """The prompt string for a 16-cell puzzle; it alone carries what the reward needs."""
    if len(puzzle) != CELLS or any(ch not in DIGITS + BLANK for ch in puzzle):
        raise ValueError(f"a puzzle is 16 characters from '1234.', got {puzzle!r}")
    rows = " ".join(puzzle[r * SIZE : (r + 1) * SIZE] for r in range(SIZE))
    return f"{PREFIX}{rows}{SEPARATOR}"


def _as_text(value: str | list[dict[str, Any]], last_only: bool = True) -> str:
    """A plain string, or the content of chat messages (the last one for completions)."""
    if isinstance(value, str):
        return value
    contents = [str(message.get("content", "")) for message in value]
    if last_only:
        return contents[-1] if contents else ""
    return "\n".join(contents)


def parse_prompt(prompt: str | list[dict[str, Any]]) -> tuple[str, str]:
    """``(puzzle, solution)`` of a prompt (also inside chat messages).

    ValueError when there is no Sudoku prompt or its givens do not have exactly one solution.
    """
    match = _PROMPT_RE.search(_as_text(prompt, last_only=False))
    if match is None:
        raise ValueError(f"not a Sudoku prompt: {prompt!r}")
    puzzle = "".join(match.groups())
    found = completions_of(puzzle)
    if len(found) != 1:
        raise ValueError(f"puzzle {puzzle!r} has {len(found)} solutions, need exactly one")
    return puzzle, found[0]


def split_of(solution: str) -> str:
    """``"train"`` or ``"heldout"``: a hash of the solution grid decides."""
    digest = int.from_bytes(hashlib.sha256(solution.encode()).digest()[:8], "big")
    return "heldout" if digest % HELDOUT_MODULUS == 0 else "train"


def make_problems(
    n: int, seed: int, split: str = "train", blanks: int | tuple[int, int] = BLANKS
) -> list[Problem]:
    """``n`` distinct uniquely solvable puzzles of one split; same list for the same arguments.

    Each puzzle draws a blank count uniformly from ``blanks`` (an int or an inclusive range), then
    a solution of the split and that many cells, both uniformly, redrawing those two until the
    puzzle is uniquely solvable and new (so blank counts stay uniform although puzzles with many
    blanks are rarely unique). Raises when the split runs out of such puzzles.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    low, high = (blanks, blanks) if isinstance(blanks, int) else blanks
    if not 0 <= low <= high <= CELLS:
        raise ValueError(f"blanks must lie in [0, {CELLS}], got {blanks!r}")
    pool = [s for s in solutions() if split_of(s) == split]
    rng = random.Random(seed)
    seen: set[str] = set()
    problems: list[Problem] = []
    attempts = 0
    while len(problems) < n:
        count = rng.randint(low, high)  # kept while rejecting, so counts stay uniform
        while True:
            attempts += 1
            if attempts > 1000 * n + 10_000:
                raise ValueError(f"only {len(problems)} distinct {split} puzzles found, asked {n}")
            solution = rng.choice(pool)
            empty = set(rng.sample(range(CELLS), count))
            puzzle = "".join(BLANK if i in empty else ch for i, ch in enumerate(solution))
            if puzzle not in seen and len(completions_of(puzzle)) == 1:
                break
        seen.add(puzzle)
        problems.append(Problem(puzzle=puzzle, solution=solution))
    return problems


def completion_cells(completion: str | list[dict[str, Any]]) -> str:
    """The completion's cells as read by the reward (see the module docstring); may be short."""
    text = _as_text(completion).split(EOS_TEXT, 1)[0]
    text = _SPECIAL_RE.sub("?", text)  # a special token is one (wrong) cell
    return "".join(text.split())[:CELLS]


def score(prompt: str | list[dict[str, Any]], completion: str | list[dict[str, Any]]) -> float:
    """Fraction of the prompt's blank cells filled correctly (1.0 when nothing is blank)."""
    puzzle, solution = parse_prompt(prompt)
    cells = completion_cells(completion)
    empty = [i for i, ch in enumerate(puzzle) if ch == BLANK]
    if not empty:
        return 1.0
    right = sum(1 for i in empty if i < len(cells) and cells[i] == solution[i])
    return right / len(empty)


def is_solved(prompt: str | list[dict[str, Any]], completion: str | list[dict[str, Any]]) -> bool:
    """True when every blank cell of the prompt is filled with the solution's digit."""
    return score(prompt, completion) == 1.0


def sudoku_reward(
    prompts: Sequence[str | list[dict[str, Any]]],
    completions: Sequence[str | list[dict[str, Any]]],
    **kwargs: Any,
) -> list[float]:
    """TRL-style reward function: one float per (prompt, completion) pair.

    The fraction of originally blank cells filled correctly, in [0, 1]: a dense signal (partial
    credit per cell) that still reaches 1.0 only for a full solve. Extra keyword arguments (TRL
    passes dataset columns) are ignored: the prompt alone defines the puzzle and its solution.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    return [score(p, c) for p, c in zip(prompts, completions, strict=True)]
