"""The embedded digits task's generator: a tiny flow-matching model of 8x8 digits.

It works on scikit-learn's 8x8 grey digits. Pixel values ``p`` in ``0..16`` map to the flow
model's data space as ``x0 = p / 8 - 1`` (in ``[-1, 1]``) and to the reward's classifier input
(``tasks/digits.py``) as ``p / 16`` (in ``[0, 1]``); ``to_pixels`` / ``from_pixels`` convert
between the two.

Flow convention (diffusers SD3/FLUX): ``x_s = (1 - s) * x0 + s * eps``; the model predicts the
velocity ``v = eps - x0``; sampling walks ``s`` from 1 to 0.

Weights ship in ``genrl/assets/`` as safetensors whose metadata holds the constructor kwargs
(``{"config": json}``), so the loaders rebuild the right architecture. They are regenerated,
deterministically, by ``python scripts/build_assets.py``.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from loading.assets import load_model, resolve_weights
from tasks.digits import IMAGE_SIZE

EMBEDDED_FLOW = "digits_flow.safetensors"
NUM_PIXELS = IMAGE_SIZE * IMAGE_SIZE


def to_pixels(x: torch.Tensor) -> torch.Tensor:
    """Flow model space ``[-1, 1]`` -> image intensities in ``[0, 1]`` (clamped)."""
    return ((x.float() + 1.0) / 2.0).clamp(0.0, 1.0)


def from_pixels(images01: torch.Tensor) -> torch.Tensor:
    """Image intensities in ``[0, 1]`` -> flow model space ``[-1, 1]``."""
    return images01.float() * 2.0 - 1.0


def timestep_embedding(sigma: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding ``[B, dim]`` of noise levels ``sigma`` in ``[0, 1]``.

    ``sigma`` is scaled by 1000 first (the diffusers timestep range) so the frequency spread of the
    classic transformer embedding covers the unit interval well.
    """
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=sigma.device) / half
    )
    angles = sigma.float()[:, None] * 1000.0 * freqs[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class _FlowBlock(nn.Module):
    """Pre-norm residual MLP block with adaLN scale/shift from the conditioning vector."""

    def __init__(self, hidden_dim: int, cond_dim: int) -> None:
        super().__init__()
        # No affine parameters: the conditioning supplies scale and shift.
        self.norm = nn.LayerNorm(hidden_dim, elementwise_affine=False)
        self.ada = nn.Linear(cond_dim, 2 * hidden_dim)
        self.fc1 = nn.Linear(hidden_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.ada(cond).chunk(2, dim=-1)
        y = self.norm(h) * (1.0 + scale) + shift
        return h + self.fc2(F.silu(self.fc1(y)))


class DigitFlowModel(nn.Module):
    """Class-conditional flow-matching velocity model for 8x8 digits (a residual MLP).

    The label ``num_classes`` is the "null" label used for classifier-free guidance (the model is
    trained with label dropout). No dropout or batch norm anywhere, so ``train()`` and ``eval()``
    give identical outputs.

    Linear modules (names are stable; ``lora_target_modules`` lists the ones meant for LoRA):
    ``in_proj``, ``time_fc1``, ``time_fc2``, ``blocks.{i}.ada``, ``blocks.{i}.fc1``,
    ``blocks.{i}.fc2``, ``out_proj``.
    """

    lora_target_modules: list[str] = ["in_proj", "fc1", "fc2", "ada", "out_proj"]  # noqa: RUF012

    def __init__(self, hidden_dim: int = 256, num_layers: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        if hidden_dim < 2 or hidden_dim % 2:
            raise ValueError(f"hidden_dim must be an even integer >= 2, got {hidden_dim}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.num_classes = num_classes
        cond_dim = hidden_dim // 2
        self.time_fc1 = nn.Linear(cond_dim, cond_dim)
        self.time_fc2 = nn.Linear(cond_dim, cond_dim)
        # One extra row: index ``num_classes`` is the unconditional (null) label.
        self.label_emb = nn.Embedding(num_classes + 1, cond_dim)
        self.in_proj = nn.Linear(NUM_PIXELS, hidden_dim)
        self.blocks = nn.ModuleList(_FlowBlock(hidden_dim, cond_dim) for _ in range(num_layers))
        self.out_norm = nn.LayerNorm(hidden_dim, elementwise_affine=False)
        self.out_proj = nn.Linear(hidden_dim, NUM_PIXELS)

    @property
    def config(self) -> dict[str, int]:
        """Constructor kwargs (what the safetensors metadata stores)."""
        return {
            "hidden_dim": self.hidden_dim,
            "num_layers": self.num_layers,
            "num_classes": self.num_classes,
        }

    def forward(
        self, x: torch.Tensor, sigma: torch.Tensor | float, labels: torch.Tensor
    ) -> torch.Tensor:
        """Velocity ``[B, 1, 8, 8]`` at noisy sample ``x`` ``[B, 1, 8, 8]``.

        Args:
            x: noisy samples in model space.
            sigma: noise levels in ``[0, 1]``, ``[B]`` (a scalar is broadcast to the batch).
            labels: class ids ``[B]`` (long) in ``0..num_classes``; ``num_classes`` is "null".
        """
        if x.ndim != 4 or tuple(x.shape[1:]) != (1, IMAGE_SIZE, IMAGE_SIZE):
            raise ValueError(f"x must be [B, 1, 8, 8], got {tuple(x.shape)}")
        batch = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
        if sigma.ndim == 0:
            sigma = sigma.expand(batch)
        sigma = sigma.reshape(-1)
        if sigma.shape[0] != batch:
            raise ValueError(f"sigma has {sigma.shape[0]} entries but x has batch {batch}")
        labels = torch.as_tensor(labels, device=x.device).reshape(-1).long()
        if labels.shape[0] != batch:
            raise ValueError(f"labels has {labels.shape[0]} entries but x has batch {batch}")
        temb = timestep_embedding(sigma, self.time_fc1.in_features)
        cond = self.time_fc2(F.silu(self.time_fc1(temb))) + self.label_emb(labels)
        cond = F.silu(cond)
        h = self.in_proj(x.reshape(batch, NUM_PIXELS).to(self.in_proj.weight.dtype))
        for block in self.blocks:
            h = block(h, cond)
        return self.out_proj(self.out_norm(h)).reshape(batch, 1, IMAGE_SIZE, IMAGE_SIZE)


def load_flow_model(path: str | os.PathLike | None = None) -> DigitFlowModel:
    """Load a ``DigitFlowModel`` (the embedded one when ``path`` is None): CPU, float32, eval."""
    return load_model(DigitFlowModel, resolve_weights(path, EMBEDDED_FLOW))
