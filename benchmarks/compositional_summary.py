"""The compositional benchmark's figures (``benchmarks/compositional.py``): seed-mean curves,
per-method finals and "steps to Flow-GRPO's best" for one training track, the console table and
the plot.

A track's curves and thresholds use the score it trains on (``SCORE_OF``): the GenEval-rule
score for ``geneval``, ``exact`` for ``strict``; both finals are reported on both tracks.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from compositional_runs import METHODS

CATEGORIES = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
SCORE_OF = {"geneval": 3, "strict": 4}
"""Track -> the column of a curve point that holds the score the track trains on."""


def mean_curve(runs: list[dict[str, Any]], column: int = 3) -> list[dict[str, float]]:
    """Seed-mean curve of the score in ``column`` of the points: at each iteration every seed
    evaluated, the mean steps, seconds and score, and the score's std over seeds. Points
    without that column (cached before the ``exact`` column existed) are left out."""
    by_iteration: dict[float, list[list[float]]] = {}
    for run in runs:
        for point in run["curve"]:
            if len(point) > column:
                by_iteration.setdefault(point[0], []).append(point)
    curve = []
    for iteration in sorted(by_iteration):
        points = by_iteration[iteration]
        if len(points) < len(runs):
            continue
        scores = [p[column] for p in points]
        curve.append({
            "iteration": iteration,
            "steps": statistics.mean(p[1] for p in points),
            "seconds": statistics.mean(p[2] for p in points),
            "score": statistics.mean(scores),
            "std": statistics.pstdev(scores),
        })  # fmt: skip
    return curve


def first_reaching(curve: list[dict[str, float]], target: float) -> dict[str, float] | None:
    """The first point of ``curve`` at or above ``target`` (a 1e-9 slack for float sums)."""
    return next((p for p in curve if p["score"] >= target - 1e-9), None)


def _at(point: dict[str, float] | None, key: str) -> float | None:
    return None if point is None else point[key]


def ratio(value: float | None, baseline: float | None) -> float | None:
    if value is None or not baseline:
        return None
    return round(value / baseline, 3)


def summarise(
    results: dict[str, list[dict[str, Any]]],
    track: str = "geneval",
    settings: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Per-method figures of one track (see ``benchmarks/compositional.py``'s docstring);
    ``settings`` (method -> its JSON ``settings``) is copied into each row."""
    column = SCORE_OF[track]
    curves = {m: mean_curve(runs, column) for m, runs in results.items()}
    flow = curves["flow_grpo"]
    gained = len(flow) > 0 and max(p["score"] for p in flow) > flow[0]["score"]
    best = max((p["score"] for p in flow), default=math.nan)
    before = flow[0]["score"] if flow else math.nan
    gain90 = before + 0.9 * (best - before)
    flow_best, flow_90 = first_reaching(flow, best), first_reaching(flow, gain90)
    if not gained:  # no gain to reach (or no curve of this score): every "steps to" is null
        flow_best = flow_90 = None
    table: dict[str, Any] = {}
    for method, runs in results.items():
        curve = curves[method]
        hit, hit90 = first_reaching(curve, best), first_reaching(curve, gain90)
        if not gained:
            hit = hit90 = None
        finals = [r["final"] for r in runs]
        exacts = [r["final_exact"] for r in runs]

        def change(name: str, runs: list[dict[str, Any]] = runs) -> float | None:
            return _mean([r["after"].get(name, math.nan) - r["before"].get(name, math.nan)
                          for r in runs])  # fmt: skip

        def after(name: str, runs: list[dict[str, Any]] = runs) -> float | None:
            return _mean([r["after"].get(name, math.nan) for r in runs])

        steps = statistics.mean(r["optimizer_steps"] for r in runs)
        fill = statistics.mean(r["fill_seconds"] for r in runs)
        last = runs[0]["curve"][-1]  # iterations and seconds do not depend on the score column
        iterations = last[0]
        seconds = statistics.mean(r["curve"][-1][2] for r in runs)
        table[method] = {
            "recipe": runs[0]["recipe"],
            "track": track,
            "settings": (settings or {}).get(method),
            "seeds": [r["seed"] for r in runs],
            "before": round(curve[0]["score"], 4) if curve else None,
            "final": round(statistics.mean(finals), 4),
            "final_std": round(statistics.pstdev(finals), 4),
            "final_exact": round(statistics.mean(exacts), 4),
            "final_exact_std": round(statistics.pstdev(exacts), 4),
            "best": round(max(p["score"] for p in curve), 4) if curve else None,
            "per_category": {c: after(f"compositional/{c}") for c in CATEGORIES},
            "per_category_exact": {c: after(f"compositional/exact_{c}") for c in CATEGORIES},
            "objects": after("compositional/objects"),
            "diversity_change": change("sample_diversity"),
            "artifact_probe": after("artifact_probe"),
            "artifact_probe_change": change("artifact_probe"),
            "steps_to_flow_grpo_best": None if hit is None else round(hit["steps"], 1),
            "seconds_to_flow_grpo_best": None if hit is None else round(hit["seconds"], 1),
            "steps_to_flow_grpo_best_ratio": ratio(_at(hit, "steps"), _at(flow_best, "steps")),
            "seconds_to_flow_grpo_best_ratio": ratio(
                _at(hit, "seconds"), _at(flow_best, "seconds")
            ),
            "steps_to_90pct_gain": ratio(_at(hit90, "steps"), _at(flow_90, "steps")),
            "seconds_to_90pct_gain": ratio(_at(hit90, "seconds"), _at(flow_90, "seconds")),
            "optimizer_steps": round(steps, 1),
            "steps_per_iteration": round(steps / iterations, 2) if iterations else None,
            "train_seconds": round(seconds, 1),
            "fill_seconds": round(fill, 1),
            "seconds_per_iteration": (
                round((seconds - fill) / iterations, 3) if iterations else None
            ),
            "samples_drawn": max(runs[0]["samples_seen"], runs[0]["offline_samples"]),
        }
    return {
        "score": "geneval" if column == 3 else "exact",
        "flow_grpo_best": None if math.isnan(best) else round(best, 4),
        "gain90_target": None if math.isnan(gain90) else round(gain90, 4),
        "flow_grpo_gained": gained,
        "table": table,
    }


def print_table(summary: dict[str, Any], track: str) -> None:
    short = ("single", "two", "count", "colour", "pos", "attr")
    head = (
        f"{'method':<15} {'final':>13} {'exact':>13} "
        + " ".join(f"{s:>6}" for s in short)
        + f" {'objs':>5} {'div d':>7} {'probe':>6} {'st/it':>6} {'s/it':>5}"
        + f" {'st->best':>9} {'ratio':>6} {'s->best':>8} {'st->90%':>8}"
    )
    print(
        f"track {track} (trained on, and steps measured on, the {summary['score']} score): "
        f"Flow-GRPO's best seed-mean {_show(summary['flow_grpo_best'], 3)}; "
        f"90% of its gain {_show(summary['gain90_target'], 3)}"
    )
    print(head)
    for method, row in summary["table"].items():
        cats = " ".join(f"{_show(row['per_category'][c], 2):>6}" for c in CATEGORIES)
        print(
            f"{method:<15} {row['final']:>6.3f}+-{row['final_std']:.3f} "
            f"{row['final_exact']:>6.3f}+-{row['final_exact_std']:.3f} {cats} "
            f"{_show(row['objects'], 2):>5} "
            f"{_show(row['diversity_change'], 3):>7} {_show(row['artifact_probe'], 2):>6} "
            f"{_show(row['steps_per_iteration'], 1):>6} {_show(row['seconds_per_iteration'], 2):>5} "
            f"{_show(row['steps_to_flow_grpo_best'], 0):>9} "
            f"{_show(row['steps_to_flow_grpo_best_ratio'], 2):>6} "
            f"{_show(row['seconds_to_flow_grpo_best'], 0):>8} "
            f"{_show(row['steps_to_90pct_gain'], 2):>8}"
        )


def _mean(values: list[float]) -> float | None:
    """Mean of the finite values (a score is NaN where it does not apply), None if none."""
    finite = [v for v in values if math.isfinite(v)]
    return round(statistics.mean(finite), 4) if finite else None


def _show(value: float | None, digits: int) -> str:
    return "never" if value is None else f"{value:.{digits}f}"


def plot(
    by_track: dict[str, dict[str, list[dict[str, Any]]]],
    summaries: dict[str, dict[str, Any]],
    path: Path,
    iterations: int,
) -> None:
    """One row per track, two panels each: the track's score against optimizer steps and
    against training seconds; the seed mean as a line, +- one std over seeds as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(by_track), 2, figsize=(12, 4.5 * len(by_track)), squeeze=False)
    for (track, results), (by_steps, by_time) in zip(by_track.items(), axes, strict=True):
        column = SCORE_OF[track]
        for method, runs in results.items():
            _, label, colour = METHODS[method]
            curve = mean_curve(runs, column)
            score = [p["score"] for p in curve]
            low = [p["score"] - p["std"] for p in curve]
            high = [p["score"] + p["std"] for p in curve]
            for axis, x in ((by_steps, "steps"), (by_time, "seconds")):
                xs = [p[x] for p in curve]
                axis.plot(xs, score, color=colour, label=label if axis is by_steps else None)
                if len(runs) > 1:
                    axis.fill_between(xs, low, high, color=colour, alpha=0.15, linewidth=0)
        name = "GenEval-rule" if column == 3 else "strict (exact)"
        for axis in (by_steps, by_time):
            best = summaries[track]["flow_grpo_best"]
            if best is not None:
                axis.axhline(best, color="grey", linestyle="--", linewidth=1)
            axis.set_ylabel(f"held-out {name} score\n(track {track})")
            axis.grid(alpha=0.3)
        by_steps.set_xlabel("optimizer steps")
        by_time.set_xlabel("training seconds (one CPU thread; evaluation excluded)")
        by_steps.legend(loc="lower right", fontsize=7, ncol=2)
    seeds = max(len(r) for results in by_track.values() for r in results.values())
    figure.suptitle(
        f"Compositional task: {iterations} iterations, mean of {seeds} seed(s) (band: +- std);"
        " dashed: Flow-GRPO's best"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
