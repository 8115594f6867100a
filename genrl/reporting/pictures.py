"""Pictures a person would rather look at than read: sample grids (a title on top, each
prompt's text wrapped on the left), animated video grids and before | after pairs (the reward
curves are in ``curves.py``).

Text is drawn with DejaVu Sans (shipped with matplotlib, a dependency): Pillow's built-in
font at these sizes drops the width of spaces, so "digit six" read as "digitsix".
"""

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
