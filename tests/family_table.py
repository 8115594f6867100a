"""One description per diffusers flow family for the tests: how to build the tiny pipeline,
which adapter keywords to use, and how the stock ``pipe(...)`` call turns classifier-free
guidance on, so that every test drives the stock call from this table alone.

``stock_cfg(g)`` returns the call's guidance arguments for scale ``g`` (1 = no CFG). The stock
pipelines disagree on them (``guidance_scale``, or ``true_cfg_scale`` with a negative prompt for
FLUX and QwenImage, whose ``guidance_scale`` feeds a guidance embedding or is ignored; an offset
scale for Z-Image), which is
why a new family must say it here; ``test_stock_call_applies_guidance`` then fails for a
description whose guidance the pipeline silently ignores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from diffusers_tiny import build_flux, build_sana, build_sd3
from diffusers_tiny_families import build_chroma, build_lumina2, build_qwenimage, build_zimage

PROMPTS = ["a red cat", "a blue dog on the grass"]  # of different token lengths
SIZE = {"height": 32, "width": 32}


def plain_cfg(g: float) -> dict[str, Any]:
    return {"guidance_scale": g}


def offset_cfg(g: float) -> dict[str, Any]:
    """Z-Image: ``v_c + s (v_c - v_u)``, so genrl's scale ``g`` is its ``s = g - 1``."""
    return {"guidance_scale": g - 1}


def true_cfg(g: float) -> dict[str, Any]:
    """FLUX and QwenImage: CFG only with ``true_cfg_scale > 1`` and a negative prompt."""
    return {"true_cfg_scale": g, "negative_prompt": "" if g > 1 else None}


@dataclass(frozen=True)
class Family:
    build: Callable[[Path], Path]
    stock_cfg: Callable[[float], dict[str, Any]]
    policy: dict[str, Any] = field(default_factory=dict)
    """Adapter keywords (besides the image size)."""
    call: dict[str, Any] = field(default_factory=dict)
    """The same settings as stock-call keywords."""


SHORT_SYSTEM = {"system_prompt": "Draw the prompt.", "max_sequence_length": 24}
FAMILIES: dict[str, Family] = {
    "sd3": Family(build_sd3, plain_cfg),
    "flux": Family(build_flux, lambda g: {"guidance_scale": 3.5, **true_cfg(g)}),
    "sana": Family(
        build_sana,
        plain_cfg,
        # SANA's default instruction prefix is ~100 words; a short context keeps tests fast.
        {"max_sequence_length": 16, "complex_human_instruction": None},
        {"max_sequence_length": 16, "complex_human_instruction": None},
    ),
    "lumina2": Family(build_lumina2, plain_cfg, SHORT_SYSTEM, SHORT_SYSTEM),
    "qwenimage": Family(build_qwenimage, true_cfg),
    "chroma": Family(
        build_chroma, plain_cfg, {"max_sequence_length": 16}, {"max_sequence_length": 16}
    ),
    "zimage": Family(
        build_zimage, offset_cfg, {"max_sequence_length": 64}, {"max_sequence_length": 64}
    ),
}
# Stock-call keywords that are not adapter settings.
CALL_ONLY = {"sana": {"use_resolution_binning": False}}


def family_kwargs(family: str) -> dict[str, Any]:
    return {**SIZE, **FAMILIES[family].policy}


def pipe_call(
    policy: Any,
    family: str,
    noise: torch.Tensor,
    guidance: float,
    output_type: str,
    steps: int = 4,
    **extra: Any,
) -> torch.Tensor:
    """The stock pipeline's own ``__call__`` with settings equal to the adapter's."""
    description = FAMILIES[family]
    kwargs = {**description.call, **CALL_ONLY.get(family, {}), **description.stock_cfg(guidance)}
    policy.pipe.set_progress_bar_config(disable=True)
    return policy.pipe(
        prompt=list(PROMPTS),  # a copy: ZImagePipeline templates its prompt list in place
        latents=noise.clone(),
        num_inference_steps=steps,
        output_type=output_type,
        **SIZE,
        **kwargs,
        **extra,
    ).images
