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
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)


def save_side_by_side(left: Path, right: Path, path: Path, titles: tuple[str, str]) -> None:
    """Two sample grids next to each other under a title each (e.g. before | after).

    Works from the PNG files, so it also works for a run that was resumed in another process.
    """
    from PIL import Image, ImageDraw

    images = [Image.open(left).convert("RGB"), Image.open(right).convert("RGB")]
    header, gap = 24, 16
    width = images[0].width + gap + images[1].width
    canvas = Image.new("RGB", (width, header + max(i.height for i in images)), "white")
    draw = ImageDraw.Draw(canvas)
    x = 0
    for image, title in zip(images, titles, strict=True):
        draw.text((x + image.width // 2 - 3 * len(title), 6), title, fill="black")
        canvas.paste(image, (x, header))
        x += image.width + gap
    canvas.save(path)


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
