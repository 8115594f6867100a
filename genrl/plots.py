"""Pictures a person would rather look at than read: sample grids and the reward curve."""

from __future__ import annotations

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
) -> None:
    """One row per prompt (its text on the left), ``per_prompt`` samples per row.

    Args:
        images: ``[P * S, C, H, W]`` in [0, 1]; sample ``i`` belongs to prompt ``i % P``.
        prompts: the ``P * S`` prompts in sample order.
    """
    grid = _grid(images, prompts, num_prompts=num_prompts, per_prompt=per_prompt, cell=cell)
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
        _grid(videos[:, f], prompts, num_prompts=num_prompts, per_prompt=per_prompt, cell=cell)
        for f in range(videos.shape[1])
    ]
    gif_path.parent.mkdir(parents=True, exist_ok=True)
    _save_gif(frames, gif_path, frame_ms)
    distinct = list(dict.fromkeys(prompts))[:num_prompts]
    firsts = torch.stack([videos[prompts.index(p)] for p in distinct])  # [P, F, C, H, W]
    strips = firsts.transpose(0, 1).reshape(-1, *videos.shape[2:])  # frame-major order
    strip_prompts = [p for _ in range(videos.shape[1]) for p in distinct]
    strip = _grid(
        strips, strip_prompts, num_prompts=num_prompts, per_prompt=videos.shape[1], cell=cell
    )
    strip.save(strip_path)


def _grid(
    images: torch.Tensor, prompts: list[str], *, num_prompts: int, per_prompt: int, cell: int
) -> Any:
    from PIL import Image, ImageDraw

    distinct = list(dict.fromkeys(prompts))[:num_prompts]
    period = len(dict.fromkeys(prompts))
    label_w, gap = 200, 4
    width = label_w + per_prompt * (cell + gap)
    grid = Image.new("RGB", (width, len(distinct) * (cell + gap) + gap), "white")
    draw = ImageDraw.Draw(grid)
    for row, prompt in enumerate(distinct):
        top = gap + row * (cell + gap)
        draw.text((6, top + cell // 2 - 6), prompt[:32], fill="black")
        first = prompts.index(prompt)
        for col in range(per_prompt):
            index = first + col * period
            if index >= len(images):
                break
            # Nearest-neighbour upscaling keeps the pixels of tiny images honest.
            img = _to_pil(images[index]).resize((cell, cell), Image.Resampling.NEAREST)
            grid.paste(img, (label_w + col * (cell + gap), top))
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
    header, gap = 24, 16
    canvases = []
    for images in pairs:
        width = images[0].width + gap + images[1].width
        canvas = Image.new("RGB", (width, header + max(i.height for i in images)), "white")
        draw = ImageDraw.Draw(canvas)
        x = 0
        for image, title in zip(images, titles, strict=True):
            draw.text((x + image.width // 2 - 3 * len(title), 6), title, fill="black")
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


def save_reward_curve(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Training reward (mean ± std band) per iteration, with held-out evaluations as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if r.get("reward/mean") is not None]
    evals = [r for r in rows if r.get("eval/reward") is not None]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    if train:
        it = [r["iteration"] for r in train]
        mean = [r["reward/mean"] for r in train]
        std = [r.get("reward/std") or 0.0 for r in train]
        ax.plot(it, mean, label="training reward (rollout samples)", color="tab:blue")
        ax.fill_between(
            it,
            [m - s for m, s in zip(mean, std, strict=False)],
            [m + s for m, s in zip(mean, std, strict=False)],
            color="tab:blue",
            alpha=0.15,
        )
    if evals:
        ax.plot(
            [r["iteration"] for r in evals],
            [r["eval/reward"] for r in evals],
            "o-",
            color="tab:orange",
            label="held-out reward (ODE, fixed seeds)",
        )
    ax.set_xlabel("iteration")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


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
