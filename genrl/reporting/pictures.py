"""Pictures a person would rather look at than read: sample grids (a title on top, each
prompt's text wrapped on the left), animated video grids, before | after pairs, and reward
curves.

Text is drawn with DejaVu Sans (shipped with matplotlib, a dependency): Pillow's built-in
font at these sizes drops the width of spaces, so "digit six" read as "digitsix".

Reward curves show the training mean with a mean ± std band per iteration and held-out
evaluations as points; they are written to a PNG in the run directory and drawn again, per
score, for report.html. The band is clipped to the reward's declared range
(``RewardModel.score_range``) when it has one, else to the iteration's observed min/max
(``<name>/min``, ``<name>/max`` in ``metrics.jsonl``), so that a reward in [0, 1] is never
drawn below 0 or above 1.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch


def save_sample_grid(
    images: torch.Tensor,
    prompts: list[str],
    path: Path,
    *,
    num_prompts: int,
    per_prompt: int = 4,
    cell: int = 64,
    title: str | None = None,
) -> None:
    """One row per prompt (its text on the left), ``per_prompt`` samples per row, under
    ``title`` if given.

    Args:
        images: ``[P * S, C, H, W]`` in [0, 1]; sample ``i`` belongs to prompt ``i % P``.
        prompts: the ``P * S`` prompts in sample order.
    """
    grid = _grid(
        images, prompts, num_prompts=num_prompts, per_prompt=per_prompt, cell=cell, title=title
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)


def save_video_samples(
    videos: torch.Tensor,
    prompts: list[str],
    gif_path: Path,
    strip_path: Path,
    *,
    num_prompts: int,
    per_prompt: int = 4,
    cell: int = 64,
    frame_ms: int = 250,
    title: str | None = None,
) -> None:
    """Held-out videos as an animated GIF of the sample grid (``save_sample_grid``'s layout,
    one grid per frame) and a PNG frame strip: one row per prompt, its first sample's frames
    left to right.

    Args:
        videos: ``[P * S, F, C, H, W]`` in [0, 1]; sample ``i`` belongs to prompt ``i % P``.
        prompts: the ``P * S`` prompts in sample order.
        frame_ms: how long the GIF shows each frame.
    """
    frames = [
        _grid(
            videos[:, f],
            prompts,
            num_prompts=num_prompts,
            per_prompt=per_prompt,
            cell=cell,
            title=title,
        )
        for f in range(videos.shape[1])
    ]
    gif_path.parent.mkdir(parents=True, exist_ok=True)
    _save_gif(frames, gif_path, frame_ms)
    distinct = list(dict.fromkeys(prompts))[:num_prompts]
    firsts = torch.stack([videos[prompts.index(p)] for p in distinct])  # [P, F, C, H, W]
    strips = firsts.transpose(0, 1).reshape(-1, *videos.shape[2:])  # frame-major order
    strip_prompts = [p for _ in range(videos.shape[1]) for p in distinct]
    strip = _grid(
        strips,
        strip_prompts,
        num_prompts=num_prompts,
        per_prompt=videos.shape[1],
        cell=cell,
        title=None if title is None else f"{title}: frames left to right",
    )
    strip.save(strip_path)


LABEL_WIDTH = 200  # pixels of the prompt column
FONT_SIZE = 12


def font(size: int = FONT_SIZE) -> Any:
    """DejaVu Sans at ``size`` px (matplotlib's copy), or Pillow's default font without it."""
    from PIL import ImageFont

    try:
        import matplotlib

        path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
        return ImageFont.truetype(str(path), size)
    except (ImportError, OSError):
        return ImageFont.load_default(size)


def wrap_label(text: str, width: int, face: Any, max_lines: int = 3) -> list[str]:
    """``text`` broken at spaces into lines at most ``width`` px wide (a word too long for a
    line is cut); more than ``max_lines`` lines end in an ellipsis."""
    lines: list[str] = []
    for word in text.split():
        candidate = f"{lines[-1]} {word}" if lines else word
        if lines and face.getlength(candidate) <= width:
            lines[-1] = candidate
            continue
        while face.getlength(word) > width and len(word) > 1:  # cut an over-long word
            fits = (k for k in range(1, len(word)) if face.getlength(word[:k]) <= width)
            cut = max(fits, default=1)
            lines.append(word[:cut])
            word = word[cut:]
        lines.append(word)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        while lines[-1] and face.getlength(lines[-1] + "…") > width:
            lines[-1] = lines[-1][:-1]
        lines[-1] += "…"
    return lines


def _grid(
    images: torch.Tensor,
    prompts: list[str],
    *,
    num_prompts: int,
    per_prompt: int,
    cell: int,
    title: str | None = None,
) -> Any:
    from PIL import Image, ImageDraw

    distinct = list(dict.fromkeys(prompts))[:num_prompts]
    period = len(dict.fromkeys(prompts))
    per_prompt = min(per_prompt, -(-len(images) // period))  # no empty columns
    face, gap = font(), 4
    line_h = FONT_SIZE + 3
    header = 2 * gap + line_h + 4 if title else 0
    width = LABEL_WIDTH + per_prompt * (cell + gap)
    height = header + len(distinct) * (cell + gap) + gap
    grid = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(grid)
    if title:
        draw.text((6, gap + 2), title, fill="black", font=font(FONT_SIZE + 1))
    for row, prompt in enumerate(distinct):
        top = header + gap + row * (cell + gap)
        lines = wrap_label(prompt, LABEL_WIDTH - 12, face, max_lines=max(1, cell // line_h))
        y = top + (cell - len(lines) * line_h) // 2
        for k, line in enumerate(lines):
            draw.text((6, y + k * line_h), line, fill="black", font=face)
        first = prompts.index(prompt)
        for col in range(per_prompt):
            index = first + col * period
            if index >= len(images):
                break
            # Nearest-neighbour upscaling keeps the pixels of tiny images honest.
            img = _to_pil(images[index]).resize((cell, cell), Image.Resampling.NEAREST)
            grid.paste(img, (LABEL_WIDTH + col * (cell + gap), top))
    return grid


def _save_gif(frames: list[Any], path: Path, frame_ms: int) -> None:
    frames[0].save(
        path, save_all=True, append_images=frames[1:], duration=frame_ms, loop=0, optimize=False
    )


def save_side_by_side(left: Path, right: Path, path: Path, titles: tuple[str, str]) -> None:
    """Two sample grids next to each other under a title each (e.g. before | after); two
    animated GIFs of equal length make an animated GIF, frame by frame.

    Works from the files, so it also works for a run that was resumed in another process.
    """
    from PIL import Image, ImageDraw

    with Image.open(left) as a, Image.open(right) as b:
        timed_a, timed_b = _timed_frames(a), _timed_frames(b)
    # GIF writers merge identical consecutive frames (a still clip is one long frame), so the
    # two are paired by time: each frame repeated over the slots of the shortest duration.
    frame_ms = min((ms for _, ms in timed_a + timed_b if ms > 0), default=250)
    pairs = list(zip(_slots(timed_a, frame_ms), _slots(timed_b, frame_ms), strict=False))
    face = font(FONT_SIZE + 2)
    header, gap = 28, 16
    canvases = []
    for images in pairs:
        width = images[0].width + gap + images[1].width
        canvas = Image.new("RGB", (width, header + max(i.height for i in images)), "white")
        draw = ImageDraw.Draw(canvas)
        x = 0
        for image, title in zip(images, titles, strict=True):
            title_x = x + max(0, (image.width - int(face.getlength(title))) // 2)
            draw.text((title_x, 6), title, fill="black", font=face)
            canvas.paste(image, (x, header))
            x += image.width + gap
        canvases.append(canvas)
    if path.suffix.lower() == ".gif":
        _save_gif(canvases, path, frame_ms)
    else:
        canvases[0].save(path)


def _timed_frames(picture: Any) -> list[tuple[Any, int]]:
    """A picture's frames in RGB with their durations in ms (0 for a still image)."""
    from PIL import ImageSequence

    return [
        (frame.convert("RGB"), int(frame.info.get("duration", 0) or 0))
        for frame in ImageSequence.Iterator(picture)
    ]


def _slots(timed: list[tuple[Any, int]], slot_ms: int) -> list[Any]:
    return [frame for frame, ms in timed for _ in range(max(1, round(ms / slot_ms)))]


def _to_pil(image: torch.Tensor) -> Any:
    from PIL import Image

    array = (image.clamp(0, 1) * 255).round().to(torch.uint8)
    if array.shape[0] == 1:
        return Image.fromarray(array[0].numpy(), mode="L").convert("RGB")
    return Image.fromarray(array.permute(1, 2, 0).numpy(), mode="RGB")


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
