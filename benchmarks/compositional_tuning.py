"""The compositional benchmark's tuning (``benchmarks/compositional.py --tune``): an equal grid
per method, selected on the validation split of training combinations, never on held-out ones.

Protocol. Each method's grid is the learning rate x ``LR_FACTORS`` (0.5, 1, 2 of the recipe's)
times the three values of its main knob (``TUNING_KNOBS`` beside the recipes in
``genrl/recipes/compositional_methods.py``): nine runs per method and track, each with the
benchmark's budget (``--tune-iterations``, by default ``--iterations``) on the tuning seeds
(``--tune-seeds``, by default 100: none of the reported seeds 0-2, so that the reported runs
are not the runs the setting was picked on). A tuning run trains on the training combinations
that are not validation ones and is evaluated on the validation prompts
(``prompts.dataset=compositional_tuning``; ``tasks.compositional.is_validation``).

Selection (``select``): the setting with the highest validation score of the track (GenEval's
rule for ``geneval``, ``exact`` for ``strict``), averaged over the last ``SELECT_LAST``
evaluations of each tuning seed's curve and over the tuning seeds (one evaluation of 22 prompts
x 8 samples has a standard error near 0.03, so one point alone would pick noise). Ties, to
1e-9, go to the setting nearest the recipe's (``|log2 lr factor|`` plus the distance in knob
positions), then to the grid's order. The reported runs then train the selected setting on
every training combination, evaluated on the held-out prompts, over the reported seeds.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from cached_runs import write_result
from compositional_runs import RunSpec, Setting, knob, recipe_setting, train_one

SELECT_LAST = 3
"""Evaluations at the end of a validation curve averaged for selection."""


def grid(method: str) -> list[Setting]:
    """The method's nine settings, learning-rate factor major."""
    from genrl.recipes.compositional_methods import LR_FACTORS

    return [Setting(f, float(v)) for f in LR_FACTORS for v in knob(method).values]


def validation_score(curves: list[list[list[float]]], column: int) -> float:
    """Mean over seeds of the mean of the last ``SELECT_LAST`` points' ``column``."""
    return statistics.mean(
        statistics.mean(point[column] for point in curve[-SELECT_LAST:]) for curve in curves
    )


def distance(setting: Setting, default: Setting, values: tuple[float, ...]) -> float:
    """How far ``setting`` is from the recipe's: ``|log2 lr factor|`` + knob positions apart."""
    positions = [float(v) for v in values]
    apart = abs(positions.index(setting.value) - positions.index(default.value))
    return abs(math.log2(setting.lr_factor / default.lr_factor)) + apart


def select(
    candidates: list[tuple[Setting, float]], default: Setting, values: tuple[float, ...]
) -> Setting:
    """The best-scoring setting of ``(setting, validation score)`` pairs in grid order, ties
    broken as the module docstring says."""
    top = max(score for _, score in candidates)
    tied = [s for s, score in candidates if score >= top - 1e-9]
    return min(tied, key=lambda s: distance(s, default, values))  # min keeps the first of equals


def tune(
    method: str,
    track: str,
    seeds: list[int],
    iterations: int,
    eval_every: int,
    out: Path,
    quick: bool,
    keep: bool,
) -> tuple[Setting, dict[str, Any], int]:
    """Run (or read from the cache) the method's grid on the validation split and select.

    Returns the selected setting, the record written to ``<out>/tuning/`` (every setting's
    validation score) and how many runs were trained now."""
    from compositional_summary import SCORE_OF

    column, trained = SCORE_OF[track], 0
    candidates: list[tuple[Setting, float]] = []
    for setting in grid(method):
        curves = []
        for seed in seeds:
            spec = RunSpec(method, track, seed, iterations, eval_every, quick, setting, True)
            result = train_one(spec, out, keep)
            trained += not result["cached"]
            curves.append(result["curve"])
        candidates.append((setting, validation_score(curves, column)))
    default = recipe_setting(method)
    chosen = select(candidates, default, knob(method).values)
    record = {
        "method": method,
        "track": track,
        "knob": knob(method).field,
        "seeds": seeds,
        "iterations": iterations,
        "select_last": SELECT_LAST,
        "grid": [
            {"lr_factor": s.lr_factor, "value": s.value, "validation": round(v, 4)}
            for s, v in candidates
        ],
        "selected": {"lr_factor": chosen.lr_factor, "value": chosen.value},
        "recipe": {"lr_factor": default.lr_factor, "value": default.value},
    }
    name = f"{method}-{track}-it{iterations}-ev{eval_every}" + ("-quick" if quick else "")
    path = out / "tuning" / f"{name}.json"
    write_result(path, record, indent=1)
    return chosen, record, trained
