"""Reward curves: the training mean with a mean ± std band per iteration and the evaluations
as points, written to a PNG in the run directory and drawn again, per score, for report.html;
and every part of the reward in one plot (``score_curves.png``).

The band is clipped to the reward's declared range (``RewardModel.score_range``) when it has
one, else to the iteration's observed min/max (``<name>/min``, ``<name>/max`` in
``metrics.jsonl``), so that a reward in [0, 1] is never drawn below 0 or above 1. Legends sit
below the axes, never over the curves, and iteration ticks are whole numbers.
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
    figure = curve_figure(
        rows,
        name,
        title,
        train_label=train_label,
        eval_label=eval_label,
        score_range=score_range,
    )
    data = _png(figure)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return data


def curve_figure(
    rows: list[dict[str, Any]],
    name: str,
    title: str,
    *,
    train_label: str,
    eval_label: str,
    score_range: tuple[float, float] | None = None,
) -> Any:
    """The matplotlib figure of ``draw_curve`` (the caller closes it)."""
    points = curve_points(rows, name, score_range)
    figure, ax = _axes()
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
    _finish_axes(figure, ax, name, title, columns=1)
    return figure


def save_score_curves(rows: list[dict[str, Any]], names: list[str], path: Path, title: str) -> bool:
    """Each named score's training mean per iteration (``<name>/mean`` in ``metrics.jsonl``),
    one line per score: the criteria of a rubric, the parts of a composite reward. Returns
    False (and writes nothing) when none was logged."""
    figure = score_curves_figure(rows, names, title)
    if figure is None:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_png(figure))
    return True


def score_curves_figure(rows: list[dict[str, Any]], names: list[str], title: str) -> Any:
    """The matplotlib figure of ``save_score_curves``, or None when no score was logged. A
    NaN mean (the score applied to no sample of that iteration, e.g. a question kind that was
    not drawn) is no point, and a score with no point gets no line and no legend entry."""
    curves = {}
    for name in names:
        points = [
            (r["iteration"], mean)
            for r in rows
            if (mean := r.get(f"{name}/mean")) is not None and mean == mean
        ]
        if points:
            curves[name] = points
    if not curves:
        return None
    figure, ax = _axes()
    for name, points in curves.items():
        # A score logged at few iterations (a question kind drawn now and then) is dots, not
        # a line that a single point would leave invisible.
        marker = {"marker": "o", "markersize": 3} if len(points) < SPARSE else {}
        ax.plot([p[0] for p in points], [p[1] for p in points], label=name, **marker)
    _finish_axes(figure, ax, "training mean", title, columns=2 if len(curves) > 3 else 1)
    return figure


SPARSE = 20  # a score with fewer points than this is drawn with markers


def _axes() -> tuple[Any, Any]:
    """A figure with one axes; constrained layout makes room for a legend outside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6.4, 4.4), dpi=110, layout="constrained")


def _finish_axes(figure: Any, ax: Any, ylabel: str, title: str, columns: int) -> None:
    """Labels, grid, whole-number iteration ticks, and the legend below the axes: inside
    them, even at matplotlib's "best" place, it covered the VLM's and the video task's
    curves, which span the whole height."""
    from matplotlib.ticker import MaxNLocator

    # Iterations are whole numbers: a 2-iteration run had ticks at 1.2, 1.4, ...
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        figure.legend(loc="outside lower center", ncols=columns, fontsize="small")


def _png(figure: Any) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return buffer.getvalue()


def curve_labels(config: Any, on_training_prompts: bool = False) -> tuple[str, str]:
    """Legend labels naming how a run's samples were made: SDE/ODE for flow models, sampled or
    greedy completions for token models (a text run's held-out reward is not from an ODE),
    and what was evaluated: "held-out reward", or "reward on the training prompts" for a run
    without a held-out set."""
    evaluation = "reward on the training prompts" if on_training_prompts else "held-out reward"
    if config.generation is not None:
        temperature = float(getattr(config.generation, "eval_temperature", 0.0))
        how = "greedy" if temperature == 0 else f"temperature {temperature:g}, fixed seeds"
        return "training reward (sampled completions)", f"{evaluation} ({how})"
    steps = getattr(config.sampler, "eval_num_steps", None)
    ode = f"{steps}-step ODE" if steps else "ODE"
    return "training reward (rollout samples)", f"{evaluation} ({ode}, fixed seeds)"
