"""Reward curves: the training mean with a mean ± std band per iteration, held-out evaluations
as points. Written to a PNG in the run directory and drawn again, per score, for report.html.

The band is clipped to the reward's declared range (``RewardModel.score_range``) when it has
one, else to the iteration's observed min/max (``<name>/min``, ``<name>/max`` in
``metrics.jsonl``), so that a reward in [0, 1] is never drawn below 0 or above 1.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any


def band(mean: float, std: float, low: float | None, high: float | None) -> tuple[float, float]:
    """``mean ± std`` clipped to ``[low, high]`` (a missing bound does not clip)."""
    lo, hi = mean - std, mean + std
    if low is not None:
        lo = max(lo, low)
    if high is not None:
        hi = min(hi, high)
    return lo, hi


def curve_points(
    rows: list[dict[str, Any]], name: str, score_range: tuple[float, float] | None = None
) -> dict[str, list[float]]:
    """The training curve of score ``name`` from ``metrics.jsonl`` rows: ``iteration``,
    ``mean``, and the band's ``low`` and ``high`` per iteration that logged the score, plus
    the held-out points (``eval_iteration``, ``eval``) of ``eval/<name>`` (``eval/reward``
    for the total ``reward``)."""
    points: dict[str, list[float]] = {
        k: [] for k in ("iteration", "mean", "low", "high", "eval_iteration", "eval")
    }
    for row in rows:
        mean = row.get(f"{name}/mean")
        if mean is not None and mean == mean:  # NaN: the score applied to no sample
            std = row.get(f"{name}/std") or 0.0
            low, high = (
                score_range
                if score_range is not None
                else (row.get(f"{name}/min"), row.get(f"{name}/max"))
            )
            lo, hi = band(mean, std, low, high)
            for key, value in zip(
                ("iteration", "mean", "low", "high"), (row["iteration"], mean, lo, hi), strict=True
            ):
                points[key].append(value)
        held_out = row.get(f"eval/{name}")
        if held_out is not None:
            points["eval_iteration"].append(row["iteration"])
            points["eval"].append(held_out)
    return points


def draw_curve(
    rows: list[dict[str, Any]],
    name: str,
    title: str,
    *,
    train_label: str,
    eval_label: str,
    score_range: tuple[float, float] | None = None,
    path: Path | None = None,
) -> bytes:
    """Draw score ``name``'s curve; returns the PNG (also written to ``path`` if given)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    points = curve_points(rows, name, score_range)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    if points["iteration"]:
        ax.plot(points["iteration"], points["mean"], label=train_label, color="tab:blue")
        ax.fill_between(
            points["iteration"],
            points["low"],
            points["high"],
            color="tab:blue",
            alpha=0.15,
            label="± 1 std, within the reward's range",
        )
    if points["eval"]:
        ax.plot(
            points["eval_iteration"], points["eval"], "o-", color="tab:orange", label=eval_label
        )
    if score_range is not None:
        pad = 0.03 * (score_range[1] - score_range[0])
        ax.set_ylim(score_range[0] - pad, score_range[1] + pad)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations are whole numbers
    ax.set_xlabel("iteration")
    ax.set_ylabel(name)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if points["iteration"] or points["eval"]:
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    data = buffer.getvalue()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return data


def save_score_curves(rows: list[dict[str, Any]], names: list[str], path: Path, title: str) -> bool:
    """Each named score's training mean per iteration (``<name>/mean`` in ``metrics.jsonl``),
    one line per score: the criteria of a rubric, the parts of a composite reward. Returns
    False (and writes nothing) when none was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {}
    for name in names:
        points = [
            (r["iteration"], r[f"{name}/mean"]) for r in rows if r.get(f"{name}/mean") is not None
        ]
        if points:
            curves[name] = points
    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for name, points in curves.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], label=name)
    ax.set_xlabel("iteration")
    ax.set_ylabel("training mean")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def curve_labels(config: Any) -> tuple[str, str]:
    """Legend labels naming how a run's samples were made: SDE/ODE for flow models, sampled or
    greedy completions for token models (a text run's held-out reward is not from an ODE)."""
    if config.generation is not None:
        temperature = float(getattr(config.generation, "eval_temperature", 0.0))
        how = "greedy" if temperature == 0 else f"temperature {temperature:g}, fixed seeds"
        return "training reward (sampled completions)", f"held-out reward ({how})"
    steps = getattr(config.sampler, "eval_num_steps", None)
    ode = f"{steps}-step ODE" if steps else "ODE"
    return "training reward (rollout samples)", f"held-out reward ({ode}, fixed seeds)"
