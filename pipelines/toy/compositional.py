"""The compositional task's generator: a tiny text-conditioned flow model of 32x32 RGB scenes.

The prompt's words (a fixed word-level vocabulary, ``VOCAB``) go through a small transformer
encoder; the canvas's four grid cells are the tokens of a small transformer that cross-attends
to the words, modulated (adaLN) by the noise level and a pooled text vector
(``CompositionalFlowModel``). Canvases in ``[0, 1]`` map to the model's space as ``x0 = 2 p - 1``
(``pipelines.toy.models.to_pixels`` / ``from_pixels``).

Flow convention as in ``pipelines.toy.models``: ``x_s = (1 - s) x0 + s eps``, the velocity is
``v = eps - x0``; like the video model, the network predicts the clean canvas and the velocity
is derived from it (``forward``). Weights ship in ``genrl/assets/compositional/`` as float16
safetensors with the constructor kwargs in the metadata; they are regenerated,
deterministically, by ``python scripts/build_compositional_assets.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from loading.assets import embedded_asset_path
from pipelines.toy.models import timestep_embedding
from tasks.compositional import (
    CANVAS,
    CELL,
    COLOUR_NAMES,
    GRID,
    NUMBERS,
    PLURALS,
    RELATIONS,
    SHAPES,
    TEMPLATES,
)

PAD, START = "<pad>", "<start>"
_WORDS = {w for t in TEMPLATES for w in t.format("").split()} | {"a", "and"}
_WORDS |= {w for r in RELATIONS for w in r.split()} | set(COLOUR_NAMES) | set(SHAPES)
_WORDS |= set(PLURALS.values()) | set(NUMBERS)
VOCAB: tuple[str, ...] = (PAD, START, *sorted(_WORDS))
"""The text encoder's words; every token sequence starts with ``START``, so the null prompt of
classifier-free guidance (``START`` alone) attends to something."""
MAX_TOKENS = 16
SIGMA_MIN = 1e-3
"""Velocities are derived as ``(x - x0_hat) / max(sigma, SIGMA_MIN)``."""
EMBEDDED_COMPOSITIONAL_FLOW = "compositional/flow.safetensors"
_BUILD_HINT = "regenerate it with `python scripts/build_compositional_assets.py`"


def tokenize(prompts: list[str], device: torch.device | str = "cpu") -> torch.Tensor:
    """Token ids ``[B, MAX_TOKENS]``: ``START``, the lower-cased words (a final full stop
    dropped), then ``PAD``; a word outside ``VOCAB`` or a prompt too long raises ValueError."""
    index = {w: i for i, w in enumerate(VOCAB)}
    rows = []
    for prompt in prompts:
        words = prompt.lower().strip().rstrip(".").split()
        unknown = [w for w in words if w not in index]
        if unknown:
            raise ValueError(
                f"prompt {prompt!r}: the compositional model does not know the words {unknown}; "
                f"its vocabulary is {', '.join(VOCAB[2:])}"
            )
        if len(words) + 1 > MAX_TOKENS:
            raise ValueError(f"prompt {prompt!r} has more than {MAX_TOKENS - 1} words")
        ids = [index[START]] + [index[w] for w in words]
        rows.append(ids + [index[PAD]] * (MAX_TOKENS - len(ids)))
    return torch.tensor(rows, dtype=torch.long, device=device)


def null_tokens(batch: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The empty prompt ``[batch, MAX_TOKENS]`` (``START`` then padding): CFG's null branch."""
    tokens = torch.zeros(batch, MAX_TOKENS, dtype=torch.long, device=device)
    tokens[:, 0] = VOCAB.index(START)
    return tokens


class _Attention(nn.Module):
    """Multi-head self-attention with plain ``nn.Linear`` projections (LoRA-targetable)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        batch, length, dim = h.shape
        q, k, v = self.qkv(h).reshape(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        return self.proj(out.transpose(1, 2).reshape(batch, length, dim))


class _TextBlock(nn.Module):
    """Pre-norm transformer encoder layer."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads)
        self.ff1, self.ff2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.norm1(h), keep)
        return h + self.ff2(F.gelu(self.ff1(self.norm2(h))))


class _CellBlock(nn.Module):
    """One generator layer over the cell tokens: self-attention among the cells and an MLP,
    both modulated (adaLN) by the noise level and the pooled text, and cross-attention from
    every cell to the prompt's tokens."""

    def __init__(self, dim: int, text_dim: int, cond_dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ada = nn.Linear(cond_dim, 4 * dim)
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.attn = _Attention(dim, heads)
        self.norm_cross = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(text_dim, 2 * dim)
        self.cross_out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(
        self, h: torch.Tensor, cond: torch.Tensor, text: torch.Tensor, keep: torch.Tensor
    ) -> torch.Tensor:
        batch, cells, dim = h.shape
        scale1, shift1, scale2, shift2 = self.ada(cond)[:, None].chunk(4, dim=-1)
        every = torch.ones(batch, cells, dtype=torch.bool, device=h.device)
        h = h + self.attn(self.norm1(h) * (1 + scale1) + shift1, every)
        q = self.q(self.norm_cross(h)).reshape(batch, cells, self.heads, -1).transpose(1, 2)
        k, v = self.kv(text).reshape(batch, text.shape[1], 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        h = h + self.cross_out(out.transpose(1, 2).reshape(batch, cells, dim))
        return h + self.fc2(F.silu(self.fc1(self.norm2(h) * (1 + scale2) + shift2)))


class CompositionalFlowModel(nn.Module):
    """Text-conditioned flow-matching model of ``[3, 32, 32]`` canvases.

    Text path: token and position embeddings (``text_dim``), ``text_layers`` transformer
    layers; ``text_queries`` learned queries attend over the outputs (padding masked) and
    their concatenation, projected, joins the noise level's embedding as the adaLN vector.
    Image path: each of the ``GRID x GRID`` cells of the noisy canvas is a token
    (``in_proj`` of its pixels plus a learned cell embedding, ``hidden_dim`` wide);
    ``num_layers`` blocks of self-attention among the cells, cross-attention to the text
    tokens and an MLP; ``out_proj`` maps each token back to its cell's clean pixels. Weights
    are shared over cells, so a shape is learned once for every place, and the attention
    decides which cell draws which object of the prompt. No dropout or batch norm, so
    ``train()`` and ``eval()`` agree.

    Linear modules meant for LoRA (``lora_target_modules``): ``in_proj``, ``out_proj``, the
    blocks' ``ada``, ``qkv``, ``proj``, ``q``, ``kv``, ``cross_out``, ``fc1``, ``fc2``, the
    text layers' ``qkv``, ``proj``, ``ff1``, ``ff2`` and the pooling's ``kv`` and ``text_out``.
    """

    lora_target_modules: list[str] = [  # noqa: RUF012
        "in_proj",
        "out_proj",
        "ada",
        "qkv",
        "proj",
        "q",
        "kv",
        "cross_out",
        "fc1",
        "fc2",
        "ff1",
        "ff2",
        "text_out",
    ]

    def __init__(
        self,
        hidden_dim: int = 128,
        num_layers: int = 3,
        text_dim: int = 64,
        text_layers: int = 2,
        text_queries: int = 4,
        heads: int = 4,
    ) -> None:
        super().__init__()
        for name, value in (("hidden_dim", hidden_dim), ("text_dim", text_dim)):
            if value < 2 or value % 2 or value % heads:
                raise ValueError(f"{name} must be even and divisible by heads, got {value}")
        if num_layers < 1 or text_layers < 0 or text_queries < 1:
            raise ValueError("num_layers and text_queries must be >= 1, text_layers >= 0")
        self.hidden_dim, self.num_layers = hidden_dim, num_layers
        self.text_dim, self.text_layers, self.text_queries, self.heads = (
            text_dim,
            text_layers,
            text_queries,
            heads,
        )
        self.event_shape = (3, CANVAS, CANVAS)
        cond_dim = hidden_dim
        self.token_emb = nn.Embedding(len(VOCAB), text_dim)
        self.pos_emb = nn.Parameter(torch.randn(MAX_TOKENS, text_dim) * 0.02)
        self.text_blocks = nn.ModuleList(_TextBlock(text_dim, heads) for _ in range(text_layers))
        self.text_norm = nn.LayerNorm(text_dim)
        self.queries = nn.Parameter(torch.randn(text_queries, text_dim) * 0.02)
        self.pool_kv = nn.Linear(text_dim, 2 * text_dim)
        self.text_out = nn.Linear(text_queries * text_dim, cond_dim)
        self.time_fc1 = nn.Linear(cond_dim, cond_dim)
        self.time_fc2 = nn.Linear(cond_dim, cond_dim)
        self.in_proj = nn.Linear(3 * CELL * CELL, hidden_dim)
        self.cell_emb = nn.Parameter(torch.randn(GRID * GRID, hidden_dim) * 0.02)
        self.blocks = nn.ModuleList(
            _CellBlock(hidden_dim, text_dim, cond_dim, heads) for _ in range(num_layers)
        )
        self.out_norm = nn.LayerNorm(hidden_dim, elementwise_affine=False)
        self.out_proj = nn.Linear(hidden_dim, 3 * CELL * CELL)

    @property
    def config(self) -> dict[str, int]:
        """Constructor kwargs (what the safetensors metadata stores)."""
        return {
            "hidden_dim": self.hidden_dim,
            "num_layers": self.num_layers,
            "text_dim": self.text_dim,
            "text_layers": self.text_layers,
            "text_queries": self.text_queries,
            "heads": self.heads,
        }

    def encode_text(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Text features ``[B, MAX_TOKENS, text_dim]``, their keep mask ``[B, MAX_TOKENS]``
        (False on padding) and the pooled vector ``[B, hidden_dim]`` of token ids
        ``[B, MAX_TOKENS]``."""
        if tokens.ndim != 2 or tokens.shape[1] != MAX_TOKENS:
            raise ValueError(f"tokens must be [B, {MAX_TOKENS}], got {tuple(tokens.shape)}")
        keep = tokens != VOCAB.index(PAD)
        h = self.token_emb(tokens) + self.pos_emb
        for block in self.text_blocks:
            h = block(h, keep)
        h = self.text_norm(h)
        k, v = self.pool_kv(h).chunk(2, dim=-1)
        heads, batch = self.heads, tokens.shape[0]
        q = self.queries.expand(batch, -1, -1).reshape(batch, self.text_queries, heads, -1)
        k = k.reshape(batch, MAX_TOKENS, heads, -1)
        v = v.reshape(batch, MAX_TOKENS, heads, -1)
        pooled = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=keep[:, None, None]
        )
        return h, keep, self.text_out(pooled.transpose(1, 2).reshape(batch, -1))

    def clean(
        self, x: torch.Tensor, sigma: torch.Tensor | float, tokens: torch.Tensor
    ) -> torch.Tensor:
        """Predicted clean canvas ``x0_hat`` ``[B, 3, 32, 32]`` (arguments as ``forward``)."""
        if x.ndim != 4 or tuple(x.shape[1:]) != self.event_shape:
            raise ValueError(f"x must be [B, *{self.event_shape}], got {tuple(x.shape)}")
        batch = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
        sigma = sigma.expand(batch) if sigma.ndim == 0 else sigma.reshape(-1)
        if not sigma.shape[0] == tokens.shape[0] == batch:
            raise ValueError(
                f"batch {batch} but sigma/tokens have {sigma.shape[0]}/{tokens.shape[0]} entries"
            )
        text, keep, pooled = self.encode_text(tokens)
        temb = timestep_embedding(sigma, self.time_fc1.in_features)
        cond = F.silu(self.time_fc2(F.silu(self.time_fc1(temb))) + pooled)
        # [B, 3, GRID, CELL, GRID, CELL] -> [B, GRID * GRID, 3 * CELL * CELL], rows then columns.
        cells = x.to(self.in_proj.weight.dtype).reshape(batch, 3, GRID, CELL, GRID, CELL)
        cells = cells.permute(0, 2, 4, 1, 3, 5).reshape(batch, GRID * GRID, -1)
        h = self.in_proj(cells) + self.cell_emb
        for block in self.blocks:
            h = block(h, cond, text, keep)
        out = self.out_proj(self.out_norm(h)).reshape(batch, GRID, GRID, 3, CELL, CELL)
        return out.permute(0, 3, 1, 4, 2, 5).reshape(batch, *self.event_shape)

    def forward(
        self, x: torch.Tensor, sigma: torch.Tensor | float, tokens: torch.Tensor
    ) -> torch.Tensor:
        """Velocity ``[B, 3, 32, 32]`` at noisy canvases ``x``: ``(x - x0_hat) / max(sigma,
        SIGMA_MIN)`` (see ``pipelines.toy.video.MovingDigitFlowModel.forward`` for why the
        network predicts ``x0``).

        Args:
            x: noisy canvases ``[B, 3, 32, 32]`` in model space.
            sigma: noise levels ``[B]`` in ``[0, 1]`` (a scalar is broadcast).
            tokens: token ids ``[B, MAX_TOKENS]`` (``tokenize``; ``null_tokens`` for CFG).
        """
        x0_hat = self.clean(x, sigma, tokens)
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
        sigma = sigma.expand(x.shape[0]) if sigma.ndim == 0 else sigma.reshape(-1)
        scale = sigma.clamp_min(SIGMA_MIN).view(-1, 1, 1, 1)
        return (x.to(x0_hat.dtype) - x0_hat) / scale


def save_compositional_model(model: CompositionalFlowModel, path: str | os.PathLike) -> None:
    """Write ``model`` as float16 safetensors (the asset's storage format) with its kwargs."""
    from safetensors.torch import save_file

    tensors = {
        k: v.detach().to("cpu", torch.float16).contiguous() for k, v in model.state_dict().items()
    }
    # One metadata key: safetensors writes several in an order that varies from process to
    # process, and the shipped file must rebuild byte for byte.
    save_file(tensors, str(path), metadata={"config": json.dumps(model.config, sort_keys=True)})


def load_compositional_model(path: str | os.PathLike | None = None) -> CompositionalFlowModel:
    """Load a ``CompositionalFlowModel`` (the embedded one when ``path`` is None): CPU, float32
    (float16-stored weights widened exactly), eval mode."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    resolved = embedded_asset_path(EMBEDDED_COMPOSITIONAL_FLOW) if path is None else Path(path)
    if not resolved.is_file():
        hint = f"; {_BUILD_HINT}" if path is None else ""
        raise FileNotFoundError(f"compositional model weights not found at {resolved}{hint}")
    with safe_open(str(resolved), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if "config" not in metadata:
        raise ValueError(
            f"{resolved} has no 'config' metadata; was it written by save_compositional_model?"
        )
    model = CompositionalFlowModel(**json.loads(metadata["config"]))
    model.load_state_dict({k: v.float() for k, v in load_file(str(resolved)).items()}, strict=True)
    return model.float().eval()
