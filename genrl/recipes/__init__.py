"""Recipes: functions returning a complete ``TrainConfig``; ``genrl train NAME`` runs one.

One module per family of recipes (``digits.py``, ``images.py``, ``text.py``, ...), the registry
that collects them (``registry.py``: ``RECIPES``, ``get_recipe``) and the catalog of their names,
descriptions and needs (``catalog.py``), which the command line reads without importing torch.
Importing this package imports neither: ``RECIPES`` and ``get_recipe`` load the registry on
first use (PEP 562), so that ``genrl.recipes.catalog`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genrl.recipes.registry import DEFAULT_RECIPE, RECIPES, get_recipe

__all__ = ["DEFAULT_RECIPE", "RECIPES", "get_recipe"]


def __getattr__(name: str) -> Any:
    """The registry's public names, imported on first access."""
    if name in __all__:
        value = getattr(importlib.import_module("genrl.recipes.registry"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'genrl.recipes' has no attribute {name!r}")
