"""Shapes VQA: questions about small synthetic pictures of coloured shapes.

genrl's embedded vision-language task (the tiny Qwen2-VL in ``genrl/assets/shapes_vlm``). Every
problem is drawn from a seed, its answer is known by construction, and the reward compares
strings, so RL needs no reward model.

Pictures: ``IMAGE_SIZE`` x ``IMAGE_SIZE`` pixels on a white background, split into a
``GRID`` x ``GRID`` grid of cells; 1 to ``MAX_SHAPES`` shapes (``SHAPES``) in distinct cells,
each in one of ``COLOURS``, drawn with PIL (a one-pixel jitter inside its cell). The 2 x 2 grid
of 16-pixel cells lines up with the embedded Qwen2-VL's vision tokens (4-pixel patches merged
2 x 2); with a 3 x 3 grid of 10-pixel cells its pretraining (under the character-level
tokenizer it had then) stayed at the answer priors (about 0.35 accuracy) for 600 steps.

Questions (``KINDS``), each with a one-word answer:

* ``count``: "How many shapes?" -- a digit;
* ``count_colour``: "How many red shapes?" -- a digit (0 included);
* ``count_shape``: "How many circles?" -- a digit (0 included);
* ``colour_at``: "What colour is the leftmost shape?" (or rightmost, top, bottom) -- a colour;
  asked only when exactly one shape lies furthest that way;
* ``shape_at``: "What shape is the top shape?" (same directions) -- ``circle``, ``square`` or
  ``triangle``;
* ``exists``: "Is there a red square?" -- ``yes`` or ``no`` (half of each).

Prompt text: ``"<question> (#<index>)"``; the index makes the texts of a problem set distinct,
since genrl identifies a prompt by its text (group keys, per-prompt tables) while the picture
rides along in ``Prompt.columns["images"]``. The completion is the answer word, then the end
token.

Splits: a problem belongs to ``"heldout"`` when the sha256 of its scene and question is
divisible by ``HELDOUT_MODULUS``, otherwise to ``"train"``: a pure function of the problem, so
the splits never overlap, whatever seed or size is asked for.

Balance: the held-out set keeps the existence answers balanced (``BALANCED_KINDS``: a "yes"
problem is skipped while it has more "yes" than "no", and the other way round). Without it the
1,000 held-out problems had 128 "no" to 83 "yes": a "yes" question names a shape in the scene,
and there are few distinct ones for small scenes, so de-duplication inside the one-in-five
split drops more of them. A policy that learnt to say "no" to every existence question then
gained 0.046 held-out accuracy with no vision at all (docs/algorithms/vlm.md). The training
split is left as drawn (432 "no" to 423 "yes" in the first 4,000): the shipped model was
pretrained on it, and a training set only needs to be drawn from the task.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

IMAGE_SIZE = 32
GRID = 2
MAX_SHAPES = 4
BACKGROUND = (255, 255, 255)
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 230),
    "yellow": (235, 200, 30),
}
SHAPES = ("circle", "square", "triangle")
KINDS = ("count", "count_colour", "count_shape", "colour_at", "shape_at", "exists")
DIRECTIONS = ("leftmost", "rightmost", "top", "bottom")
HELDOUT_MODULUS = 5  # one problem in five is held out
SPLITS = ("train", "heldout")
# Question kinds whose answers the held-out split keeps balanced: binary ones, where a constant
# answer would otherwise score the share of the majority answer.
BALANCED_KINDS: dict[str, tuple[str, ...]] = {"exists": ("yes", "no")}
# Every answer the task can ask for; ``MAX_ANSWER_CHARS + 1`` new tokens hold any of them and
# the end token under any tokenizer (the embedded model's spends one token on each).
ANSWERS = tuple(str(n) for n in range(MAX_SHAPES + 1)) + tuple(COLOURS) + SHAPES + ("yes", "no")
MAX_ANSWER_CHARS = max(len(a) for a in ANSWERS)

CORRECT_REWARD = 1.0
VALID_REWARD = 0.1  # a wrong answer that is still one of ``ANSWERS``

Item = tuple[str, str, int, int]  # (shape, colour, column, row)


@dataclass(frozen=True)
class Problem:
    """One picture with one question; ``items`` are ``(shape, colour, column, row)``."""

    items: tuple[Item, ...]
    question: str
    answer: str
    kind: str
    jitter: tuple[tuple[int, int], ...]

    def image(self) -> Any:
        """The picture as an RGB PIL image."""
        return draw(self.items, self.jitter)

    def prompt(self, index: int) -> Any:
        """``Prompt("<question> (#index)", {"images": [picture], "answer": answer})``."""
        from tasks.prompt import Prompt

        return Prompt(format_prompt(self.question, index), {"images": [self.image()], **self.row})

    @property
    def row(self) -> dict[str, str]:
        """The dataset columns a reward reads."""
        return {"answer": self.answer, "kind": self.kind}


def format_prompt(question: str, index: int) -> str:
    return f"{question} (#{index})"


def draw(items: tuple[Item, ...], jitter: tuple[tuple[int, int], ...]) -> Any:
    """Each item drawn into its grid cell (shifted by its jitter) on a white picture."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUND)
    canvas = ImageDraw.Draw(image)
    cell = IMAGE_SIZE // GRID
    margin = (IMAGE_SIZE - cell * GRID) // 2
    for (shape, colour, column, row), (dx, dy) in zip(items, jitter, strict=True):
        left, top = margin + column * cell + 1 + dx, margin + row * cell + 1 + dy
        right, bottom = left + cell - 3, top + cell - 3
        fill = COLOURS[colour]
        if shape == "circle":
            canvas.ellipse((left, top, right, bottom), fill=fill)
        elif shape == "square":
            canvas.rectangle((left + 1, top + 1, right - 1, bottom - 1), fill=fill)
        else:
            canvas.polygon([((left + right) / 2, top), (right, bottom), (left, bottom)], fill=fill)
    return image


def _extreme(items: tuple[Item, ...], direction: str) -> Item | None:
    """The one item furthest in ``direction``, or None when several share that place."""
    key = {
        "leftmost": lambda i: i[2],
        "rightmost": lambda i: -i[2],
        "top": lambda i: i[3],
        "bottom": lambda i: -i[3],
    }[direction]
    best = min(key(i) for i in items)
    winners = [i for i in items if key(i) == best]
    return winners[0] if len(winners) == 1 else None


def ask(items: tuple[Item, ...], kind: str, rng: random.Random) -> tuple[str, str] | None:
    """``(question, answer)`` of ``kind`` about ``items``, or None when it cannot be asked."""
    if kind == "count":
        return "How many shapes?", str(len(items))
    if kind == "count_colour":
        colour = rng.choice(list(COLOURS))
        return f"How many {colour} shapes?", str(sum(i[1] == colour for i in items))
    if kind == "count_shape":
        shape = rng.choice(SHAPES)
        return f"How many {shape}s?", str(sum(i[0] == shape for i in items))
    if kind in ("colour_at", "shape_at"):
        direction = rng.choice(DIRECTIONS)
        item = _extreme(items, direction)
        if item is None:
            return None
        if kind == "colour_at":
            return f"What colour is the {direction} shape?", item[1]
        return f"What shape is the {direction} shape?", item[0]
    if kind == "exists":
        present = {(i[0], i[1]) for i in items}
        if rng.random() < 0.5:
            shape, colour = rng.choice(sorted(present))
        else:
            absent = [(s, c) for s in SHAPES for c in COLOURS if (s, c) not in present]
            shape, colour = rng.choice(absent)
        answer = "yes" if (shape, colour) in present else "no"
        return f"Is there a {colour} {shape}?", answer
    raise ValueError(f"unknown question kind {kind!r}; known: {', '.join(KINDS)}")


def split_of(items: tuple[Item, ...], question: str) -> str:
    """``"train"`` or ``"heldout"``: a hash of the scene and the question decides."""
    key = ";".join(",".join(map(str, i)) for i in sorted(items)) + "?" + question
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "heldout" if digest % HELDOUT_MODULUS == 0 else "train"


def random_problem(rng: random.Random) -> Problem:
    """One problem: a uniform number of shapes in distinct cells, then a uniform question kind
    (redrawn until it can be asked about the scene)."""
    count = rng.randint(1, MAX_SHAPES)
    cells = rng.sample([(c, r) for r in range(GRID) for c in range(GRID)], count)
    items = tuple(
        (rng.choice(SHAPES), rng.choice(list(COLOURS)), column, row) for column, row in cells
    )
    jitter = tuple((rng.randint(0, 1), rng.randint(0, 1)) for _ in items)
    while True:
        kind = rng.choice(KINDS)
        asked = ask(items, kind, rng)
        if asked is not None:
            return Problem(items, asked[0], asked[1], kind, jitter)


def make_problems(n: int, seed: int, split: str = "train") -> list[Problem]:
    """``n`` distinct problems of ``split``, the same for the same ``(n, seed, split)``; a
    shorter list is a prefix of a longer one. In ``"heldout"`` the answers of each kind in
    ``BALANCED_KINDS`` never lead one another by more than one problem."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"shapes-{seed}")
    problems: list[Problem] = []
    seen: set[tuple[tuple[Item, ...], str]] = set()
    answered = {kind: dict.fromkeys(answers, 0) for kind, answers in BALANCED_KINDS.items()}
    while len(problems) < n:
        problem = random_problem(rng)
        key = (tuple(sorted(problem.items)), problem.question)
        if split_of(problem.items, problem.question) != split or key in seen:
            continue
        counts = answered.get(problem.kind) if split == "heldout" else None
        if counts is not None:
            if counts[problem.answer] > min(counts.values()):
                continue  # this answer is ahead: wait for the other one
            counts[problem.answer] += 1
        seen.add(key)
        problems.append(problem)
    return problems


def normalise(completion: str) -> str:
    """The first word of the first line, lower-cased, without surrounding punctuation."""
    lines = completion.replace("<|im_end|>", "\n").strip().splitlines()
    words = lines[0].split() if lines else []
    return words[0].strip(".,!?;:'\"()").lower() if words else ""


def shapes_reward(completions: list[str], answers: list[str]) -> list[float]:
    """``CORRECT_REWARD`` when the normalised completion is the answer, ``VALID_REWARD`` when it
    is another word of ``ANSWERS``, 0 otherwise."""
    rewards = []
    for completion, answer in zip(completions, answers, strict=True):
        word = normalise(completion)
        if word == answer.lower():
            rewards.append(CORRECT_REWARD)
        else:
            rewards.append(VALID_REWARD if word in ANSWERS else 0.0)
    return rewards
