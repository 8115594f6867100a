"""Rubric criteria: their format, where rubrics come from, and the deterministic pieces of the
routes (verifiers and rule extractors).

A rubric is a list of criteria. Each criterion is a dict (JSON or YAML)::

    {"id": "answer", "text": "The final answer is correct", "weight": 5,
     "category": "essential",              # essential | important | optional | pitfall
     "route": "extract",                   # verifier | extract | judge
     "verifier": "numeric", "verifier_kwargs": {"rel_tol": 1e-6},
     "extractor": "judge",                 # judge | last_number | boxed | "regex:<pattern>"
     "extract": "the final numeric answer",  # what the extractor is asked for
     "answer": "42",                       # ground truth (default: the sample's "answer")
     "needs_image": false}                 # judge route: show the judge the image

The categories and their roles follow "Rubrics as Rewards" (Gunjal et al. 2025,
https://arxiv.org/abs/2507.17746: Essential / Important / Optional / Pitfall criteria) and
RLR^3 (Yu et al. 2026, https://arxiv.org/abs/2605.30244, abstract: essential criteria take
priority over additional ones). A pitfall criterion names a mistake: a score of 1 means the
response *makes* it, and it subtracts (``reward_models/rubric/reward.py``).

The three routes are RLR^3's execution paths (abstract): a deterministic Python verifier on the
response; an extractor (an LLM asked for the answer only, or a rule) followed by a verifier,
where the extractor never sees the ground truth; or an LLM judge. Verifiers are named built-ins
(``VERIFIERS``) or ``"module:function"`` import strings with the signature
``fn(text: str, answer: Any, **verifier_kwargs) -> float | bool | None`` (None: not
applicable).
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CATEGORIES: tuple[str, ...] = ("essential", "important", "optional", "pitfall")
ROUTES: tuple[str, ...] = ("verifier", "extract", "judge")
Verifier = Callable[..., "float | bool | None"]


@dataclass(frozen=True)
class Criterion:
    """One rubric criterion (see the module docstring for the fields)."""

    id: str
    text: str
    weight: float = 1.0
    category: str = "important"
    route: str = "judge"
    verifier: str | None = None
    verifier_kwargs: dict[str, Any] = field(default_factory=dict)
    extractor: str = "judge"
    extract: str = "the final answer"
    answer: Any = None
    needs_image: bool = False

    @property
    def key(self) -> str:
        """What identifies the criterion across batches (POW3R's state): id and text."""
        return f"{self.id}\x1f{self.text}"


def parse_criterion(raw: dict[str, Any], index: int) -> Criterion:
    """A ``Criterion`` from its dict, with the field checks (unknown fields are refused)."""
    if isinstance(raw, str):
        raw = {"text": raw}
    if not isinstance(raw, dict) or "text" not in raw:
        raise ValueError(f"rubric criterion {index}: need a dict with a 'text', got {raw!r}")
    known = set(Criterion.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"rubric criterion {index}: unknown fields {sorted(unknown)}")
    values = dict(raw)
    values.setdefault("id", f"c{index}")
    values["id"], values["weight"] = str(values["id"]), float(values.get("weight", 1.0))
    crit = Criterion(**values)
    if crit.category not in CATEGORIES:
        raise ValueError(f"criterion {crit.id!r}: category must be one of {CATEGORIES}")
    if crit.route not in ROUTES:
        raise ValueError(f"criterion {crit.id!r}: route must be one of {ROUTES}")
    if crit.weight < 0:
        raise ValueError(f"criterion {crit.id!r}: weight must be >= 0 (pitfalls subtract)")
    if crit.route in ("verifier", "extract") and crit.verifier is None:
        raise ValueError(f"criterion {crit.id!r}: route {crit.route!r} needs a 'verifier'")
    if crit.route == "extract":
        extractor_of(crit.extractor)  # fails early on an unknown extractor
    return crit


def parse_rubric(raw: Any) -> list[Criterion]:
    """Criteria from a list of dicts, a ``{"criteria": [...]}`` dict, a JSON/YAML string or a
    path to a ``.json``/``.yaml``/``.yml`` file. Criterion ids must be unique."""
    if isinstance(raw, (str, Path)):
        raw = load_structured(raw)
    if isinstance(raw, dict):
        raw = raw.get("criteria", raw.get("rubric"))
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise ValueError(f"a rubric is a non-empty list of criteria, got {raw!r}")
    criteria = [parse_criterion(item, i) for i, item in enumerate(raw)]
    ids = [c.id for c in criteria]
    if len(set(ids)) != len(ids):
        raise ValueError(f"rubric criterion ids must be unique, got {ids}")
    return criteria


def load_structured(source: str | Path) -> Any:
    """JSON or YAML text, or a file holding it. YAML needs PyYAML (``import yaml``)."""
    text, suffix = str(source), ""
    path = Path(text)
    if len(text) < 4096 and "\n" not in text and path.suffix in (".json", ".yaml", ".yml"):
        if not path.is_file():
            raise FileNotFoundError(f"rubric file {path} not found")
        text, suffix = path.read_text(), path.suffix
    if suffix in ("", ".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            if suffix == ".json":
                raise
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError as err:  # pragma: no cover - PyYAML ships with the dev environment
        raise ValueError("YAML rubrics need PyYAML (pip install pyyaml); use JSON") from err
    return yaml.safe_load(text)


# -- verifiers ----------------------------------------------------------------------------------
_NUMBER = re.compile(r"[-+]?(?:\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def _norm(text: Any) -> str:
    return " ".join(str(text).strip().lower().split()).rstrip(".")


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands commas allowed), or None."""
    found = _NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def verify_exact(text: str, answer: Any, **_: Any) -> float | None:
    """1 when the text equals the answer (or one of a list of answers) up to case, surrounding
    whitespace and a final period; None (not applicable) without an answer."""
    if answer is None:
        return None
    answers = answer if isinstance(answer, (list, tuple)) else [answer]
    return float(any(_norm(text) == _norm(a) for a in answers))


def verify_numeric(
    text: str, answer: Any, rel_tol: float = 1e-6, abs_tol: float = 1e-9, **_: Any
) -> float | None:
    """1 when the last number in ``text`` equals ``answer`` within ``math.isclose`` tolerances;
    None (not applicable) without an answer."""
    if answer is None:
        return None
    got = last_number(str(text))
    return float(
        got is not None and math.isclose(got, float(answer), rel_tol=rel_tol, abs_tol=abs_tol)
    )


def verify_contains(text: str, answer: Any, case_sensitive: bool = False, **_: Any) -> float | None:
    """1 when ``answer`` (a string, or every string of a list) occurs in ``text``; None (not
    applicable) without an answer."""
    if answer is None:
        return None
    needles = answer if isinstance(answer, (list, tuple)) else [answer]
    hay = text if case_sensitive else text.lower()
    return float(all((n if case_sensitive else str(n).lower()) in hay for n in needles))


def verify_regex(text: str, answer: Any = None, pattern: str | None = None, **_: Any) -> float:
    """1 when ``pattern`` (default: the answer) is found in ``text`` (``re.search``)."""
    return float(re.search(str(pattern if pattern is not None else answer), text) is not None)


def verify_word_count(
    text: str, answer: Any = None, min_words: int = 0, max_words: int | None = None, **_: Any
) -> float:
    """1 when the text has between ``min_words`` and ``max_words`` whitespace-separated words."""
    del answer
    n = len(text.split())
    return float(n >= min_words and (max_words is None or n <= max_words))


VERIFIERS: dict[str, Verifier] = {
    "exact": verify_exact,
    "numeric": verify_numeric,
    "contains": verify_contains,
    "regex": verify_regex,
    "word_count": verify_word_count,
}


def verifier_of(name: str) -> Verifier:
    """A built-in verifier by name, or ``"module:function"`` imported."""
    if name in VERIFIERS:
        return VERIFIERS[name]
    if ":" not in name:
        raise ValueError(f"unknown verifier {name!r}: one of {sorted(VERIFIERS)} or 'module:fn'")
    module, attr = name.split(":", 1)
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise ValueError(f"verifier {name!r} is not callable")
    return fn


# -- rule extractors ----------------------------------------------------------------------------
def _boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extractor_of(name: str) -> Callable[[str], str | None] | None:
    """A rule extractor ``fn(response) -> answer | None``; None for ``"judge"`` (the LLM
    extractor, run batched by the reward)."""
    if name == "judge":
        return None
    if name == "last_number":
        return lambda text: _NUMBER.findall(text)[-1] if _NUMBER.findall(text) else None
    if name == "boxed":
        return _boxed
    if name.startswith("regex:"):
        pattern = re.compile(name[len("regex:") :])

        def by_regex(text: str) -> str | None:
            found = list(pattern.finditer(text))
            if not found:
                return None
            return found[-1].group(1) if pattern.groups else found[-1].group(0)

        return by_regex
    raise ValueError(f"unknown extractor {name!r}: judge, last_number, boxed or 'regex:<pattern>'")


__all__ = [
    "CATEGORIES",
    "ROUTES",
    "VERIFIERS",
    "Criterion",
    "extractor_of",
    "last_number",
    "load_structured",
    "parse_criterion",
    "parse_rubric",
    "verifier_of",
]
