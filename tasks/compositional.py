"""Compositional text-to-image task: a small GenEval on 32x32 RGB canvases.

A scene is a black ``CANVAS`` x ``CANVAS`` picture split into a ``GRID`` x ``GRID`` grid of
``CELL``-pixel cells; each cell holds at most one object, one of ``SHAPES`` in one of
``COLOURS`` (rendering: ``tasks.compositional_render``). Prompts come from a
grammar covering GenEval's six categories (``CATEGORIES``, GenEval's own tag names):

* ``single_object``: "a photo of a triangle" -- at least one triangle;
* ``two_object``: "a photo of a circle and a cross" -- at least one of each;
* ``counting``: "a photo of three squares" -- exactly three squares (any colours);
* ``colors``: "a photo of a red circle" -- at least one red circle;
* ``position``: "a photo of a circle left of a square" -- a circle in a column left of a
  square's (``above``/``below``: in a row above/below);
* ``color_attr``: "a photo of a red circle and a blue square" -- at least one of each, the
  colours bound to the right shapes (the two colours differ).

Every prompt has a structured ``Spec`` (``parse_prompt`` reads one back from any template's
text), and ``requirements_met`` checks a scene read by a scorer against it.

Split by combination: a spec's ``key`` names its combination independently of word order and
phrasing ("a circle and a cross" = "a cross and a circle"; "a circle left of a square" = "a
square right of a circle"), and a combination is held out when the sha256 of ``SPLIT_SALT`` and
its key is divisible by ``HELDOUT_MODULUS``: a pure function of the combination, so no held-out
combination is ever in a training prompt. ``SPLIT_SALT`` is the first integer from 0 with which
every category keeps combinations in training and holds some out: one of the categories of 4
and 6 combinations, at least two of the larger ones (24: 1, 1, 2, 4, 4 and 26 held out).

Validation split, for tuning: a training combination is a validation combination when the sha256
of ``VALIDATION_SALT`` and its key is divisible by ``HELDOUT_MODULUS``. Only training
combinations are ever validation ones, so a setting chosen on them has seen no held-out
combination; a tuning run trains on the other training combinations (``tuning_train_prompts``)
and is scored on these (``validation_prompts``). ``VALIDATION_SALT`` is the first integer from 0
with which every category keeps training combinations and has a validation one (0: 1, 1, 2, 1,
5 and 19 of the 3, 5, 10, 12, 20 and 70 training combinations).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache

CANVAS = 32
GRID = 2
CELL = CANVAS // GRID
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
PLURALS: dict[str, str] = {s: s + ("es" if s.endswith("s") else "s") for s in SHAPES}
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.15, 0.15),
    "green": (0.15, 0.75, 0.2),
    "blue": (0.2, 0.35, 1.0),
    "yellow": (0.95, 0.85, 0.1),
}
COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)
NUMBERS: dict[str, int] = {"two": 2, "three": 3, "four": 4}
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
CATEGORIES: tuple[str, ...] = (
    "single_object",
    "two_object",
    "counting",
    "colors",
    "position",
    "color_attr",
)
TEMPLATES: tuple[str, ...] = ("a photo of {}", "{}")
"""Prompt wordings: ``{}`` is the scene's phrase. Held-out evaluation uses the first one."""
HELDOUT_MODULUS = 5  # about one combination in five is held out
SPLIT_SALT = 24
SPLITS = ("train", "heldout")
VALIDATION_SALT = 0
EVAL_PROMPTS_PER_CATEGORY = 8
"""Held-out evaluation takes at most this many prompts of each category, so that the small
categories are not drowned by ``color_attr`` (GenEval averages over categories too)."""


@dataclass(frozen=True)
class ObjectSpec:
    """One kind of object a prompt asks for: a shape, optionally a colour, and how many."""

    shape: str
    colour: str | None = None
    count: int = 1

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; known: {', '.join(SHAPES)}")
        if self.colour is not None and self.colour not in COLOURS:
            raise ValueError(f"unknown colour {self.colour!r}; known: {', '.join(COLOURS)}")
        if not 1 <= self.count <= GRID * GRID:
            raise ValueError(f"count must be in 1..{GRID * GRID}, got {self.count}")

    def phrase(self) -> str:
        if self.count > 1:
            number = next(w for w, n in NUMBERS.items() if n == self.count)
            return f"{number} {PLURALS[self.shape]}"
        return "a " + (f"{self.colour} " if self.colour else "") + self.shape


@dataclass(frozen=True)
class Spec:
    """What a prompt asks for: its category, its objects and (``position``) the relation
    ``objects[0] <relation> objects[1]``."""

    category: str
    objects: tuple[ObjectSpec, ...]
    relation: str | None = None

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown category {self.category!r}; known: {CATEGORIES}")
        if (self.relation is not None) != (self.category == "position"):
            raise ValueError("a relation is given exactly for the position category")
        if self.relation is not None and self.relation not in RELATIONS:
            raise ValueError(f"unknown relation {self.relation!r}; known: {RELATIONS}")
        if sum(o.count for o in self.objects) > GRID * GRID:
            raise ValueError(f"{self} asks for more objects than the {GRID * GRID} cells")

    def phrase(self) -> str:
        """The prompt without its template: "a red circle and a blue square"."""
        parts = [o.phrase() for o in self.objects]
        if self.relation is not None:
            return f"{parts[0]} {self.relation} {parts[1]}"
        return " and ".join(parts)

    def text(self, template: int = 0) -> str:
        if not 0 <= template < len(TEMPLATES):
            raise ValueError(f"template must be in 0..{len(TEMPLATES) - 1}, got {template}")
        return TEMPLATES[template].format(self.phrase())

    @property
    def key(self) -> str:
        """The combination, independent of word order: objects sorted for "and", relations
        turned to ``left of`` / ``above``."""
        objects, relation = list(self.objects), self.relation
        if relation in ("right of", "below"):
            objects.reverse()
            relation = "left of" if relation == "right of" else "above"
        names = [f"{o.count}x{o.colour or 'any'} {o.shape}" for o in objects]
        if relation is None:
            return f"{self.category}:" + "|".join(sorted(names))
        return f"{self.category}:{names[0]}|{relation}|{names[1]}"

    @property
    def split(self) -> str:
        return split_of(self.key)


def split_of(key: str, salt: int = SPLIT_SALT) -> str:
    """``"heldout"`` or ``"train"`` for a combination ``key`` (``Spec.key``)."""
    digest = hashlib.sha256(f"{salt}:{key}".encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") % HELDOUT_MODULUS == 0 else "train"


@cache
def all_specs() -> tuple[Spec, ...]:
    """Every prompt of the grammar as a spec (both word orders of "and" and of relations)."""
    specs: list[Spec] = []
    one = [ObjectSpec(s) for s in SHAPES]
    coloured = [ObjectSpec(s, c) for c in COLOUR_NAMES for s in SHAPES]
    specs += [Spec("single_object", (o,)) for o in one]
    specs += [Spec("two_object", (a, b)) for a in one for b in one if a != b]
    specs += [Spec("counting", (ObjectSpec(s, None, n),)) for n in NUMBERS.values() for s in SHAPES]
    specs += [Spec("colors", (o,)) for o in coloured]
    specs += [Spec("position", (a, b), r) for r in RELATIONS for a in one for b in one if a != b]
    specs += [
        Spec("color_attr", (a, b)) for a in coloured for b in coloured if a.colour != b.colour
    ]
    return tuple(specs)


def specs_of(split: str) -> list[Spec]:
    """The specs of ``split`` (``"train"`` or ``"heldout"``), in grammar order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [s for s in all_specs() if s.split == split]


def is_validation(key: str, salt: int = VALIDATION_SALT) -> bool:
    """Whether the combination ``key`` is in the validation split: a training combination (never
    a held-out one) chosen by a hash of its own, independent of the held-out split's."""
    if split_of(key) != "train":
        return False
    digest = hashlib.sha256(f"validation{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELDOUT_MODULUS == 0


def validation_specs() -> list[Spec]:
    """The specs of the validation combinations, in grammar order."""
    return [s for s in specs_of("train") if is_validation(s.key)]


def tuning_train_prompts() -> list[str]:
    """The training prompts of a tuning run: every training spec that is not a validation one,
    in every template."""
    specs = [s for s in specs_of("train") if not is_validation(s.key)]
    return [s.text(t) for t in range(len(TEMPLATES)) for s in specs]


def validation_prompts(per_category: int = EVAL_PROMPTS_PER_CATEGORY) -> list[str]:
    """Evaluation prompts of a tuning run: up to ``per_category`` validation specs of each
    category (first template), chosen as ``heldout_prompts`` chooses."""
    return _per_category(validation_specs(), per_category)


def train_prompts() -> list[str]:
    """Every training spec in every template."""
    return [s.text(t) for t in range(len(TEMPLATES)) for s in specs_of("train")]


def heldout_prompts(per_category: int = EVAL_PROMPTS_PER_CATEGORY) -> list[str]:
    """Held-out evaluation prompts: up to ``per_category`` held-out specs of each category
    (first template), chosen in the order of their sha256 (a fixed, well-spread choice)."""
    return _per_category(specs_of("heldout"), per_category)


def _per_category(pool: list[Spec], per_category: int) -> list[str]:
    chosen: list[str] = []
    for category in CATEGORIES:
        specs = [s for s in pool if s.category == category]
        specs.sort(key=lambda s: hashlib.sha256(s.text().encode()).hexdigest())
        chosen += [s.text() for s in specs[:per_category]]
    return chosen


# -- parsing ------------------------------------------------------------------------------------
_PREFIXES = tuple(sorted((t.format("").strip() for t in TEMPLATES if t != "{}"), key=len))
_OBJECT = re.compile(
    r"^(?:a (?:(?P<colour>" + "|".join(COLOURS) + r") )?(?P<shape>" + "|".join(SHAPES) + r")"
    r"|(?P<number>" + "|".join(NUMBERS) + r") (?P<plural>" + "|".join(PLURALS.values()) + r"))$"
)
_RELATION = re.compile(r" (" + "|".join(RELATIONS) + r") ")


def _object(phrase: str, prompt: str) -> ObjectSpec:
    match = _OBJECT.match(phrase)
    if match is None:
        raise ValueError(
            f"prompt {prompt!r}: cannot read {phrase!r} as an object; expected 'a [colour] "
            f"shape' or 'NUMBER shapes' with colours {', '.join(COLOURS)}, shapes "
            f"{', '.join(SHAPES)} and numbers {', '.join(NUMBERS)}"
        )
    if match["number"]:
        shape = next(s for s, p in PLURALS.items() if p == match["plural"])
        return ObjectSpec(shape, None, NUMBERS[match["number"]])
    return ObjectSpec(match["shape"], match["colour"])


@cache
def parse_prompt(prompt: str) -> Spec:
    """The spec of a prompt of the grammar (any template, any case, surrounding spaces and a
    final full stop ignored); anything else raises ``ValueError`` saying what was expected."""
    text = " ".join(prompt.lower().strip().rstrip(".").split())
    for prefix in reversed(_PREFIXES):  # longest first
        if text.startswith(prefix + " "):
            text = text[len(prefix) + 1 :]
            break
    relations = _RELATION.findall(f" {text} ")
    if len(relations) > 1:
        raise ValueError(f"prompt {prompt!r} names several relations {relations}; at most one")
    if relations:
        first, second = _RELATION.split(f" {text} ", maxsplit=1)[0::2]
        pair = (_object(first.strip(), prompt), _object(second.strip(), prompt))
        if any(o.count > 1 or o.colour for o in pair) or pair[0] == pair[1]:
            raise ValueError(f"prompt {prompt!r}: a relation takes two different plain shapes")
        return Spec("position", pair, relations[0])
    parts = text.split(" and ")
    if len(parts) > 2:
        raise ValueError(f"prompt {prompt!r} names more than two kinds of object")
    objects = tuple(_object(p.strip(), prompt) for p in parts)
    if len(objects) == 1:
        (only,) = objects
        category = "counting" if only.count > 1 else "colors" if only.colour else "single_object"
        return Spec(category, objects)
    a, b = objects
    if a.count > 1 or b.count > 1:
        raise ValueError(f"prompt {prompt!r}: counting prompts name one kind of object")
    if a.colour is None and b.colour is None and a.shape != b.shape:
        return Spec("two_object", objects)
    if a.colour is not None and b.colour is not None and a.colour != b.colour:
        return Spec("color_attr", objects)
    raise ValueError(
        f"prompt {prompt!r}: two objects are either two different plain shapes or two "
        "shapes of two different colours"
    )


# -- checking a scene against a spec -------------------------------------------------------------
Detection = tuple[str, str, int, int]
"""One object read from a canvas: ``(shape, colour, column, row)`` of its grid cell."""


def _matches(o: ObjectSpec, found: Detection) -> bool:
    return found[0] == o.shape and (o.colour is None or found[1] == o.colour)


def requirements(spec: Spec, scene: list[Detection]) -> list[bool]:
    """Each requirement of ``spec`` (one per object kind, plus the relation) met by ``scene``?

    An object kind needs at least ``count`` matching objects (exactly ``count`` objects of the
    shape for ``counting``, as GenEval counts); the relation needs one pair of matching objects
    in the right columns (``left of``/``right of``) or rows (``above``/``below``).
    """
    met = []
    for o in spec.objects:
        n = sum(_matches(o, d) for d in scene)
        met.append(n == o.count if spec.category == "counting" else n >= o.count)
    if spec.relation is not None:
        a, b = spec.objects
        horizontal = spec.relation in ("left of", "right of")
        sign = 1 if spec.relation in ("left of", "above") else -1
        pairs = [(x, y) for x in scene if _matches(a, x) for y in scene if _matches(b, y)]
        # Detections are (shape, colour, column, row): compare columns or rows.
        met.append(
            any(sign * ((y[2] - x[2]) if horizontal else (y[3] - x[3])) > 0 for x, y in pairs)
        )
    return met


def requirements_met(spec: Spec, scene: list[Detection]) -> bool:
    """GenEval's per-prompt correctness: every requirement met."""
    return all(requirements(spec, scene))
