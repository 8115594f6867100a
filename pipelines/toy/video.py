"""The embedded video task's generator: short clips of one 8x8 digit moving across a canvas.

A clip is ``FRAMES`` frames of a ``CANVAS x CANVAS`` grey canvas (black background) on which one
scikit-learn 8x8 digit is pasted at a start position and shifted by ``SPEED`` pixels per frame in
one of four directions (``tasks.video_digits.DIRECTIONS``). Clips are ``[B, F, 1, H, W]``;
pixel intensities in ``[0, 1]`` map to the flow model's space as ``x0 = 2 p - 1``
(``pipelines.toy.models.to_pixels`` / ``from_pixels``).

Flow convention as in ``pipelines.toy.models``: ``x_s = (1 - s) x0 + s eps``, the model predicts
``v = eps - x0``. Weights ship in ``genrl/assets/video_digits/`` as float16 safetensors (half the
bytes; the loader casts to float32) with the constructor kwargs in the metadata; they are
regenerated, deterministically, by ``python scripts/build_video_assets.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from loading.assets import embedded_asset_path
from pipelines.toy.models import _FlowBlock, timestep_embedding
from tasks.video_digits import DIRECTION_STEPS

FRAMES = 6
CANVAS = 16
DIGIT = 8
SPEED = 1
"""Pixels per frame; a clip travels ``SPEED * (FRAMES - 1)`` pixels."""
ACROSS_JITTER = 1
"""Across the motion axis the digit starts within this many pixels of the canvas's middle (a
small set of placements keeps the clip distribution learnable by a tiny MLP)."""
SIGMA_MIN = 1e-3
"""Velocities are derived as ``(x - x0_hat) / max(sigma, SIGMA_MIN)``."""
NUM_DIRECTIONS = len(DIRECTION_STEPS)
EMBEDDED_VIDEO_FLOW = "video_digits/moving_digits_flow.safetensors"
_BUILD_HINT = "regenerate it with `python scripts/build_video_assets.py`"


def random_starts(directions: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Start corners ``[B, 2]`` (row, col) such that the whole path stays on the canvas.

    Along the motion axis the start is uniform over the positions that leave room for the
    ``SPEED * (FRAMES - 1)`` pixels of travel; across it, uniform within ``ACROSS_JITTER`` of the
    middle.
    """
    travel = SPEED * (FRAMES - 1)
    free = CANVAS - DIGIT  # highest top-left coordinate that keeps the digit on the canvas
    steps = torch.tensor(DIRECTION_STEPS)[directions]  # [B, 2]
    along = torch.randint(0, free - travel + 1, directions.shape, generator=generator)
    middle = free // 2
    across = torch.randint(
        middle - ACROSS_JITTER, middle + ACROSS_JITTER + 1, directions.shape, generator=generator
    )
    # Moving towards lower coordinates starts ``travel`` further along.
    along = torch.where(steps.sum(-1) < 0, along + travel, along)
    horizontal = steps[:, 1] != 0
    rows = torch.where(horizontal, across, along)
    cols = torch.where(horizontal, along, across)
    return torch.stack([rows, cols], dim=-1)


def render_clips(
    digits01: torch.Tensor, directions: torch.Tensor, starts: torch.Tensor
) -> torch.Tensor:
    """Paste each digit on a black canvas and move it: clips ``[B, F, 1, CANVAS, CANVAS]``.

    Args:
        digits01: digits ``[B, 8, 8]`` (or ``[B, 1, 8, 8]``) in ``[0, 1]``.
        directions: direction labels ``[B]`` (indices of ``DIRECTIONS``).
        starts: top-left corners ``[B, 2]`` (row, col) of the first frame.
    """
    digits01 = digits01.reshape(-1, DIGIT, DIGIT)
    batch = digits01.shape[0]
    steps = torch.tensor(DIRECTION_STEPS)[directions]  # [B, 2]
    offsets = starts[:, None, :] + SPEED * torch.arange(FRAMES)[None, :, None] * steps[:, None, :]
    if offsets.min() < 0 or offsets.max() > CANVAS - DIGIT:
        raise ValueError("a digit would leave the canvas; draw starts with random_starts()")
    span = torch.arange(DIGIT)
    rows = offsets[..., 0, None] + span  # [B, F, 8]
    cols = offsets[..., 1, None] + span
    clips = torch.zeros(batch, FRAMES, CANVAS, CANVAS, dtype=digits01.dtype)
    # One advanced-indexing write for all samples and frames.
    b = torch.arange(batch)[:, None, None, None]
    f = torch.arange(FRAMES)[None, :, None, None]
    clips[b, f, rows[..., :, None], cols[..., None, :]] = digits01[:, None]
    return clips.unsqueeze(2)


class MovingDigitFlowModel(nn.Module):
    """Flow-matching velocity model over whole clips, conditioned on a digit and a direction.

    A residual MLP on the flattened clip (``FRAMES * CANVAS * CANVAS`` values) with adaLN
    conditioning, like ``DigitFlowModel``. Label ``10`` is the null digit and label ``4`` the null
    direction (classifier-free guidance; trained with label dropout). No dropout or batch norm,
    so ``train()`` and ``eval()`` agree.

    Linear modules (``lora_target_modules`` lists the ones meant for LoRA): ``in_proj``,
    ``time_fc1``, ``time_fc2``, ``blocks.{i}.ada``, ``blocks.{i}.fc1``, ``blocks.{i}.fc2``,
    ``out_proj``.
    """

    lora_target_modules: list[str] = ["in_proj", "fc1", "fc2", "ada", "out_proj"]  # noqa: RUF012

    def __init__(
        self, hidden_dim: int = 256, num_layers: int = 3, frames: int = FRAMES, size: int = CANVAS
    ) -> None:
        super().__init__()
        if hidden_dim < 2 or hidden_dim % 2:
            raise ValueError(f"hidden_dim must be an even integer >= 2, got {hidden_dim}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        self.hidden_dim, self.num_layers, self.frames, self.size = (
            hidden_dim,
            num_layers,
            frames,
            size,
        )
        self.num_digits, self.num_directions = 10, NUM_DIRECTIONS
        self.event_shape = (frames, 1, size, size)
        values = frames * size * size
        cond_dim = hidden_dim // 2
        self.time_fc1 = nn.Linear(cond_dim, cond_dim)
        self.time_fc2 = nn.Linear(cond_dim, cond_dim)
        # One extra row each: the null label of classifier-free guidance.
        self.digit_emb = nn.Embedding(self.num_digits + 1, cond_dim)
        self.direction_emb = nn.Embedding(self.num_directions + 1, cond_dim)
        self.in_proj = nn.Linear(values, hidden_dim)
        self.blocks = nn.ModuleList(_FlowBlock(hidden_dim, cond_dim) for _ in range(num_layers))
        self.out_norm = nn.LayerNorm(hidden_dim, elementwise_affine=False)
        self.out_proj = nn.Linear(hidden_dim, values)

    @property
    def config(self) -> dict[str, int]:
        """Constructor kwargs (what the safetensors metadata stores)."""
        return {
            "hidden_dim": self.hidden_dim,
            "num_layers": self.num_layers,
            "frames": self.frames,
            "size": self.size,
        }

    def forward(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor | float,
        digits: torch.Tensor,
        directions: torch.Tensor,
    ) -> torch.Tensor:
        """Velocity ``[B, F, 1, H, W]`` at noisy clips ``x`` ``[B, F, 1, H, W]``:
        ``(x - x0_hat) / max(sigma, SIGMA_MIN)`` with ``x0_hat = self.clean(...)``.

        The network predicts the clean clip rather than the velocity because its hidden width
        is far below the clip's ``F * H * W`` values: the velocity ``eps - x0`` carries the
        full-dimensional noise, which a narrow MLP cannot pass through, while ``x0`` is
        low-dimensional (a digit, a direction, a start). Dividing by ``sigma`` re-adds the noise
        exactly, from ``x`` itself.

        Args:
            sigma: noise levels ``[B]`` in ``[0, 1]`` (a scalar is broadcast).
            digits: ``[B]`` long in ``0..10`` (10 = null).
            directions: ``[B]`` long in ``0..4`` (4 = null).
        """
        x0_hat = self.clean(x, sigma, digits, directions)
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
        sigma = sigma.expand(x.shape[0]) if sigma.ndim == 0 else sigma.reshape(-1)
        scale = sigma.clamp_min(SIGMA_MIN).view(-1, 1, 1, 1, 1)
        return (x.to(x0_hat.dtype) - x0_hat) / scale

    def clean(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor | float,
        digits: torch.Tensor,
        directions: torch.Tensor,
    ) -> torch.Tensor:
        """Predicted clean clip ``x0_hat`` ``[B, F, 1, H, W]`` (arguments as ``forward``)."""
        if x.ndim != 5 or tuple(x.shape[1:]) != self.event_shape:
            raise ValueError(f"x must be [B, *{self.event_shape}], got {tuple(x.shape)}")
        batch = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
        sigma = sigma.expand(batch) if sigma.ndim == 0 else sigma.reshape(-1)
        digits = torch.as_tensor(digits, device=x.device).reshape(-1).long()
        directions = torch.as_tensor(directions, device=x.device).reshape(-1).long()
        if not sigma.shape[0] == digits.shape[0] == directions.shape[0] == batch:
            raise ValueError(
                f"batch {batch} but sigma/digits/directions have {sigma.shape[0]}/"
                f"{digits.shape[0]}/{directions.shape[0]} entries"
            )
        temb = timestep_embedding(sigma, self.time_fc1.in_features)
        cond = self.time_fc2(F.silu(self.time_fc1(temb)))
        cond = F.silu(cond + self.digit_emb(digits) + self.direction_emb(directions))
        h = self.in_proj(x.reshape(batch, -1).to(self.in_proj.weight.dtype))
        for block in self.blocks:
            h = block(h, cond)
        return self.out_proj(self.out_norm(h)).reshape(batch, *self.event_shape)


def save_video_model(model: MovingDigitFlowModel, path: str | os.PathLike) -> None:
    """Write ``model`` as float16 safetensors (the asset's storage format) with its kwargs."""
    from safetensors.torch import save_file

    tensors = {
        k: v.detach().to("cpu", torch.float16).contiguous() for k, v in model.state_dict().items()
    }
    # One metadata key only: safetensors writes the metadata map in hash order, which differs
    # between processes, so a second key made the file's bytes (not its weights) vary per build.
    metadata = {"config": json.dumps(model.config, sort_keys=True)}
    save_file(tensors, str(path), metadata=metadata)


def load_video_flow_model(path: str | os.PathLike | None = None) -> MovingDigitFlowModel:
    """Load a ``MovingDigitFlowModel`` (the embedded one when ``path`` is None): CPU, float32
    (float16-stored weights are widened exactly), eval mode."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    resolved = embedded_asset_path(EMBEDDED_VIDEO_FLOW) if path is None else Path(path)
    if not resolved.is_file():
        hint = f"; {_BUILD_HINT}" if path is None else ""
        raise FileNotFoundError(f"video model weights not found at {resolved}{hint}")
    with safe_open(str(resolved), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if "config" not in metadata:
        raise ValueError(
            f"{resolved} has no 'config' metadata; was it written by save_video_model?"
        )
    model = MovingDigitFlowModel(**json.loads(metadata["config"]))
    state = {k: v.float() for k, v in load_file(str(resolved)).items()}
    model.load_state_dict(state, strict=True)
    return model.float().eval()
