"""Drawing scenes of the compositional task (``tasks.compositional``).

``sample_scene`` lays out a scene that meets a spec (random cells, and random colours where the
spec leaves them free); ``render`` draws a batch of scenes into canvases ``[B, 3, 32, 32]`` in
``[0, 1]`` in one vectorised pass. Each object fills part of its 16-pixel cell: a box of
``SIZES`` pixels at a random offset that keeps a one-pixel margin, its colour scaled by a random
brightness in ``BRIGHTNESS``, edges anti-aliased by 4x supersampling. Used to make the training
data of the embedded scorer and flow model (``scripts/build_compositional_assets.py``) and the
scenes of the tests.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from tasks.compositional import (
    CANVAS,
    CELL,
    COLOUR_NAMES,
    COLOURS,
    GRID,
    SHAPES,
    Detection,
    Spec,
)

SIZES = (10, 11, 12)
"""Side of an object's box in pixels (uniform)."""
BRIGHTNESS = (0.8, 1.0)
"""Range of the per-object factor its colour is multiplied by (uniform)."""
SUPERSAMPLE = 4
CELLS: tuple[tuple[int, int], ...] = tuple((c, r) for r in range(GRID) for c in range(GRID))
"""Grid cells as ``(column, row)``, in reading order (the scorer's cell order)."""


def sample_scene(spec: Spec, rng: random.Random) -> list[Detection]:
    """Objects ``(shape, colour, column, row)`` meeting ``spec``, in distinct random cells.

    Colours the spec leaves free are uniform; ``counting`` draws exactly ``count`` objects of
    the shape; ``position`` puts the first object in the column (``left of``/``right of``) or
    row (``above``/``below``) the relation asks for, the other coordinate uniform.
    """
    colours = [o.colour or rng.choice(COLOUR_NAMES) for o in spec.objects for _ in range(o.count)]
    shapes = [o.shape for o in spec.objects for _ in range(o.count)]
    if spec.relation is None:
        cells = rng.sample(CELLS, len(shapes))
    else:
        first, second = (0, 1) if spec.relation in ("left of", "above") else (1, 0)
        a, b = rng.randrange(GRID), rng.randrange(GRID)
        if spec.relation in ("left of", "right of"):
            cells = [(first, a), (second, b)]
        else:
            cells = [(a, first), (b, second)]
    return [(s, c, col, row) for s, c, (col, row) in zip(shapes, colours, cells, strict=True)]


def _coverage(shapes: torch.Tensor, sizes: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Fraction ``[N, CELL, CELL]`` of each pixel of a cell that object ``n`` covers.

    Args:
        shapes: ``[N]`` indices into ``SHAPES``.
        sizes: ``[N]`` box sides in pixels.
        offsets: ``[N, 2]`` (x, y) of the box's top-left corner inside the cell, in pixels.
    """
    fine = (torch.arange(CELL * SUPERSAMPLE, dtype=torch.float32) + 0.5) / SUPERSAMPLE
    u, v = fine[None, None, :], fine[None, :, None]  # x along columns, y along rows
    half = sizes.float()[:, None, None] / 2
    cx = offsets[:, 0].float()[:, None, None] + half
    cy = offsets[:, 1].float()[:, None, None] + half
    dx, dy = (u - cx).abs(), (v - cy).abs()
    circle = dx**2 + dy**2 <= half**2
    square = (dx <= 0.85 * half) & (dy <= 0.85 * half)
    # Apex at the top, base at the bottom of the box.
    triangle = (dy <= half) & (dx <= (v - (cy - half)) / 2)
    arm = 0.34 * half
    cross = ((dx <= arm) & (dy <= half)) | ((dy <= arm) & (dx <= half))
    masks = torch.stack([circle, square, triangle, cross], dim=1)  # [N, 4, H, W]
    chosen = masks[torch.arange(len(shapes)), shapes].float()
    return F.avg_pool2d(chosen[:, None], SUPERSAMPLE)[:, 0]


def render(scenes: list[list[Detection]], generator: torch.Generator) -> torch.Tensor:
    """Canvases ``[B, 3, CANVAS, CANVAS]`` in ``[0, 1]`` (black background) of ``scenes``.

    Sizes, offsets and brightness are drawn from ``generator`` (one draw per object, in scene
    order), so the same scenes and generator state give the same canvases.
    """
    owners = [b for b, scene in enumerate(scenes) for _ in scene]
    objects = [o for scene in scenes for o in scene]
    canvas = torch.zeros(len(scenes), 3, GRID, CELL, GRID, CELL)
    if not objects:
        return canvas.reshape(len(scenes), 3, CANVAS, CANVAS)
    for shape, colour, column, row in objects:
        if shape not in SHAPES or colour not in COLOURS or not (0 <= column < GRID > row >= 0):
            raise ValueError(f"cannot draw {(shape, colour, column, row)}")
    for b, scene in enumerate(scenes):
        if len({(o[2], o[3]) for o in scene}) != len(scene):
            raise ValueError(f"scene {b} puts two objects in one cell: {scene}")
    n = len(objects)
    sizes = torch.tensor(SIZES)[torch.randint(len(SIZES), (n,), generator=generator)]
    room = CELL - 2 - sizes  # free pixels once a one-pixel margin is kept on both sides
    offsets = 1 + (torch.rand(n, 2, generator=generator) * (room[:, None] + 1)).floor().long()
    low, high = BRIGHTNESS
    bright = low + (high - low) * torch.rand(n, generator=generator)
    shapes = torch.tensor([SHAPES.index(o[0]) for o in objects])
    rgb = torch.tensor([COLOURS[o[1]] for o in objects]) * bright[:, None]
    cells = _coverage(shapes, sizes, offsets)[:, None] * rgb[:, :, None, None]  # [N, 3, H, W]
    columns = torch.tensor([o[2] for o in objects])
    rows = torch.tensor([o[3] for o in objects])
    canvas[torch.tensor(owners), :, rows, :, columns, :] = cells
    return canvas.reshape(len(scenes), 3, CANVAS, CANVAS)


def cell_labels(scenes: list[list[Detection]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-cell targets of a scorer, cells in ``CELLS`` order: shapes ``[B, GRID * GRID]``
    (0 = empty, ``k + 1`` = ``SHAPES[k]``) and colours ``[B, GRID * GRID]`` (index into
    ``COLOUR_NAMES``; -1 for an empty cell)."""
    shapes = torch.zeros(len(scenes), len(CELLS), dtype=torch.long)
    colours = torch.full((len(scenes), len(CELLS)), -1, dtype=torch.long)
    for b, scene in enumerate(scenes):
        for shape, colour, column, row in scene:
            k = CELLS.index((column, row))
            shapes[b, k] = SHAPES.index(shape) + 1
            colours[b, k] = COLOUR_NAMES.index(colour)
    return shapes, colours
