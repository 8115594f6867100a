"""Pictures that read well: labels keep their spaces, grids carry titles, the reward band stays
inside the reward's range, and text runs' legends do not speak of ODEs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from genrl.recipes import get_recipe
from genrl.reporting.curves import (
    band,
    curve_figure,
    curve_labels,
    curve_points,
    score_curves_figure,
)
from genrl.reporting.pictures import font, save_sample_grid, wrap_label
from reward_models import CompositeReward
from reward_models.digits import DigitClassifierReward
from reward_models.text import CountdownReward, SudokuReward

ROWS = [
    {"iteration": 1, "r/mean": 0.9, "r/std": 0.2, "r/min": 0.5, "r/max": 1.0},
    {"iteration": 2, "r/mean": 0.3, "r/std": 0.5, "r/min": 0.1, "r/max": 0.6, "eval/r": 0.4},
]


def test_band_is_clipped_to_the_declared_range() -> None:
    points = curve_points(ROWS, "r", score_range=(0.0, 1.0))
    # 0.9 ± 0.2 -> [0.7, 1.1] -> top clipped to 1; 0.3 ± 0.5 -> [-0.2, 0.8] -> bottom to 0.
    assert points["low"] == pytest.approx([0.7, 0.0])
    assert points["high"] == pytest.approx([1.0, 0.8])
    assert points["eval_iteration"] == [2] and points["eval"] == [0.4]


def test_band_without_a_range_is_clipped_to_the_observed_samples() -> None:
    points = curve_points(ROWS, "r")
    # [0.7, 1.1] within observed [0.5, 1.0]; [-0.2, 0.8] within observed [0.1, 0.6].
    assert points["low"] == pytest.approx([0.7, 0.1])
    assert points["high"] == pytest.approx([1.0, 0.6])
    assert band(0.5, 0.1, None, None) == pytest.approx((0.4, 0.6))


def test_rewards_declare_their_ranges() -> None:
    assert DigitClassifierReward.score_range == (0.0, 1.0)
    assert SudokuReward(solved_bonus=1.0).score_range == (0.0, 2.0)
    assert CompositeReward([(DigitClassifierReward(), 2.0)]).score_range == (0.0, 2.0)
    assert CompositeReward([(DigitClassifierReward(), -1.0)]).score_range == (-1.0, 0.0)
    # Several rewards renormalise per sample over those that apply: no fixed bound.
    two = CompositeReward([(DigitClassifierReward(), 1.0), (CountdownReward(), 1.0)])
    assert two.score_range is None


def test_legends_name_how_samples_were_made() -> None:
    text_train, text_eval = curve_labels(get_recipe("llm_countdown_grpo"))
    assert "ODE" not in text_train + text_eval
    assert text_train == "training reward (sampled completions)"
    assert text_eval == "held-out reward (greedy)"
    dllm_eval = curve_labels(get_recipe("dllm_sudoku_maskgrpo"))[1]
    assert dllm_eval == "held-out reward (temperature 1, fixed seeds)"
    flow_eval = curve_labels(get_recipe("digits_flow_grpo"))[1]
    assert flow_eval == "held-out reward (10-step ODE, fixed seeds)"
    # A run without a held-out set evaluates its training prompts, and says so.
    on_training = curve_labels(get_recipe("llm_countdown_grpo"), on_training_prompts=True)[1]
    assert on_training == "reward on the training prompts (greedy)"


def test_labels_keep_their_spaces() -> None:
    face = font()
    # Pillow's built-in font drew "digit six" as wide as "digitsix"; a space is ~4 px here.
    assert face.getlength("digit six") - face.getlength("digitsix") >= 3
    lines = wrap_label("a handwritten digit six", 90, face)
    assert len(lines) > 1 and " ".join(lines) == "a handwritten digit six"
    assert all(face.getlength(line) <= 90 for line in lines)
    cut = wrap_label("one two three four five six seven", 40, face, max_lines=2)
    assert len(cut) == 2 and cut[-1].endswith("…")


def test_grid_has_a_title_and_a_row_per_prompt(tmp_path: Path) -> None:
    prompts = ["digit six", "digit one"]
    images = torch.zeros(4, 1, 8, 8)  # black samples, 2 per prompt
    plain, titled = tmp_path / "plain.png", tmp_path / "titled.png"
    save_sample_grid(images, prompts * 2, plain, num_prompts=2, per_prompt=2)
    save_sample_grid(images, prompts * 2, titled, num_prompts=2, per_prompt=2, title="after")
    with Image.open(plain) as a, Image.open(titled) as b:
        assert a.size == (200 + 2 * (64 + 4), 2 * (64 + 4) + 4)
        assert b.width == a.width and b.height > a.height  # room for the title
        # The title band holds dark text pixels; the plain grid's top rows are white.
        assert b.convert("L").crop((0, 0, 100, 16)).getextrema()[0] < 128
        assert a.convert("L").crop((0, 0, 200, 4)).getextrema()[0] == 255


def _rendered(figure: Any) -> tuple[Any, Any]:
    """(the axes' box, the legend's box) in pixels, once drawn."""
    figure.canvas.draw()
    (ax,) = figure.axes
    (legend,) = figure.legends
    return ax.get_window_extent(), legend.get_window_extent()


# Two iterations whose curves fill the plot from bottom to top, as the VLM's and the video
# task's did: no corner inside the axes is free for a legend.
FULL = [
    {"iteration": 1, "r/mean": 0.05, "r/std": 0.9, "eval/r": 0.95, "r/part/mean": 0.9},
    {"iteration": 2, "r/mean": 0.95, "r/std": 0.9, "eval/r": 0.05, "r/part/mean": 0.1},
]


def test_legends_sit_outside_the_axes_and_ticks_are_whole_iterations() -> None:
    import matplotlib.pyplot as plt

    curve = curve_figure(FULL, "r", "t", train_label="a", eval_label="b", score_range=(0, 1))
    parts = score_curves_figure(FULL, ["r", "r/part"], "t")
    for figure in (curve, parts):
        ax_box, legend_box = _rendered(figure)
        assert not ax_box.overlaps(legend_box)
        assert legend_box.y1 <= ax_box.y0  # below the axes
        (ax,) = figure.axes
        low, high = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if low <= t <= high]
        assert ticks and all(t == int(t) for t in ticks), ticks
        plt.close(figure)


def test_a_score_never_logged_gets_no_line_and_no_legend_entry() -> None:
    import matplotlib.pyplot as plt

    rows = [{"iteration": 1, "a/mean": 0.5, "b/mean": float("nan")}, {"iteration": 2}]
    figure = score_curves_figure(rows, ["a", "b", "c"], "t")
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == ["a"]
    (line,) = figure.axes[0].get_lines()
    assert line.get_marker() == "o"  # one point: a dot, not an invisible line
    plt.close(figure)
    assert score_curves_figure(rows, ["b", "c"], "t") is None
