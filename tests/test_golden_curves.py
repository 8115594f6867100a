"""The first iterations of every embedded recipe match their recorded golden curves (reward,
loss, gradient norm, advantages, units). A change that alters learning on purpose regenerates
them with ``python scripts/golden_curves.py --write`` and says so in its commit."""

from __future__ import annotations

from pathlib import Path

import pytest
from golden_curves import RECIPES, differences, load, run, tolerance

RECORDED = load()


@pytest.mark.parametrize(
    "recipe",
    [r if fast else pytest.param(r, marks=pytest.mark.slow) for r, fast in RECIPES.items()],
)
def test_golden_curve(recipe: str, tmp_path: Path) -> None:
    rtol, atol = tolerance(recipe)
    problems = differences(RECORDED[recipe], run(recipe, tmp_path), rtol=rtol, atol=atol)
    assert not problems, f"{recipe} learns differently:\n" + "\n".join(problems)


def test_every_embedded_recipe_has_a_curve() -> None:
    assert set(RECORDED) == set(RECIPES)
