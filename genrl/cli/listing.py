"""``genrl list``: every registry with whole descriptions, read without importing diffusers or
transformers (recipes from ``genrl.recipes.catalog``, policies and rewards from their source)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_list(args: argparse.Namespace) -> int:
    """Every registry with whole descriptions; recipes say what they need beyond a CPU."""
    import shutil
    import textwrap

    from genrl.recipes.catalog import CATALOG, DEFAULT_RECIPE

    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    name_w = 28

    def show(title: str, rows: dict[str, str]) -> None:
        print(f"{title}:")
        for name, doc in rows.items():
            lines = textwrap.wrap(doc, width - name_w - 4) or [""]
            print(f"  {name:<{name_w}}  {lines[0]}")
            for line in lines[1:]:
                print(" " * (name_w + 4) + line)

    def needs(gpu: bool, download: bool) -> str:
        marks = [m for m, on in (("GPU", gpu), ("download", download)) if on]
        return f" [needs {' + '.join(marks)}]" if marks else ""

    show(
        "recipes",
        {
            name + (" (default)" if name == DEFAULT_RECIPE else ""): entry.description
            + needs(entry.needs_gpu, entry.needs_download)
            for name, entry in CATALOG.items()
        },
    )
    if args.recipes_only:
        return 0
    from genrl.algorithms import ALGORITHMS
    from pipelines import POLICIES
    from reward_models import REWARDS
    from samplers import SAMPLERS

    show("algorithms", {n: _summary(sys.modules[c.__module__]) for n, c in ALGORITHMS.items()})
    show("policies", {n: _target_summary(t) for n, t in POLICIES.items()})
    show("rewards", {n: _target_summary(t) for n, t in REWARDS.items()})
    show("samplers", {n: _summary(c) for n, c in SAMPLERS.items()})
    print("[needs GPU]: too large for a CPU; [needs download]: weights come from the Hub")
    return 0


def _target_summary(target: object) -> str:
    """A registry target's (``module:attr``) docstring summary, read from its source file with
    ``ast`` so that listing does not import diffusers or transformers; the target itself when
    it has no docstring. A target registered as an object at run time (``GRPOTrainer``
    registers reward functions so) is summarised from its own docstring."""
    import ast
    import importlib.util

    if not isinstance(target, str):
        return _summary(target) or getattr(target, "__qualname__", repr(target))
    module, _, attr = target.partition(":")
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return target
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == attr:
            doc = ast.get_docstring(node)
            return " ".join(doc.split("\n\n")[0].split()) if doc else target
    return target


def _summary(obj: object) -> str:
    """The first paragraph of a docstring on one line: whole sentences, not its first line."""
    doc = (obj.__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())
