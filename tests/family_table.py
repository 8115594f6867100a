"""One description per diffusers flow family for the tests: how to build the tiny pipeline,
which adapter keywords to use, and how the stock ``pipe(...)`` call turns classifier-free
guidance on, so that every test drives the stock call from this table alone.

``stock_cfg(g)`` returns the call's guidance arguments for scale ``g`` (1 = no CFG). The stock
pipelines disagree on them (``guidance_scale``, or ``true_cfg_scale`` with a negative prompt for
FLUX and QwenImage, whose ``guidance_scale`` feeds a guidance embedding or is ignored; an offset
scale for Z-Image), which is
why a new family must say it here; ``test_stock_call_applies_guidance`` then fails for a
description whose guidance the pipeline silently ignores.

``VIDEO_FAMILIES`` describes the text-to-video families the same way, with their video size
(``num_frames`` included); the stock call returns ``.frames`` ``[B, F, 3, H, W]`` instead of
``.images``. ``configure(pipe, g)`` sets what a pipeline takes from its own state rather than
from call arguments (HunyuanVideo 1.5's guider and prompt template).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from diffusers_tiny import build_flux, build_sana, build_sd3
from diffusers_tiny_families import build_chroma, build_lumina2, build_qwenimage, build_zimage
from diffusers_tiny_flux2 import OUT_LAYERS, build_flux2, build_flux2_klein
from diffusers_tiny_video import build_hunyuan_video15, build_ltx

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
    embedded_guidance: bool = False
    """The stock call's guidance is a distilled guidance embedding, not CFG (FLUX.2 [dev]):
    the tests set the adapter's ``embedded_guidance`` to ``g`` and sample without CFG."""
    stock_noise: Callable[[Any, torch.Tensor], torch.Tensor] | None = None
    """Maps our initial noise to the stock call's ``latents=`` layout when they differ (FLUX.2
    takes patchified ``[B, 4C, h, w]`` and packs it into tokens itself)."""
    stock_latents: Callable[[Any, torch.Tensor], torch.Tensor] | None = None
    """Maps ``output_type="latent"`` of the stock call to our latent layout when they differ
    (FLUX.2 [klein] returns un-normalised VAE latents)."""
    size: dict[str, Any] = field(default_factory=lambda: dict(SIZE))
    """The image (or video) size, as adapter and stock-call keywords."""
    configure: Callable[[Any, float], None] | None = None
    """Sets the pipeline's own state for guidance ``g`` before a stock call (HunyuanVideo
    1.5's guider)."""


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
FLUX2_TEXT = {"max_sequence_length": 128, "text_encoder_out_layers": OUT_LAYERS}
FAMILIES["flux2"] = Family(
    build_flux2,
    plain_cfg,
    FLUX2_TEXT,
    FLUX2_TEXT,
    embedded_guidance=True,
    stock_noise=lambda policy, noise: policy._to_vae_layout(noise),
)
FAMILIES["flux2_klein"] = Family(
    build_flux2_klein,
    plain_cfg,
    FLUX2_TEXT,
    FLUX2_TEXT,
    stock_noise=lambda policy, noise: policy._to_vae_layout(noise),
    stock_latents=lambda policy, latents: policy.from_vae_latents(latents),
)
VIDEO = {**SIZE, "num_frames": 5}
HUNYUAN_SYSTEM = "Describe the video."


def configure_hunyuan(pipe: Any, g: float) -> None:
    """HunyuanVideo15Pipeline takes CFG from its guider and its prompt template from
    attributes: a short system message whose template prefix is cropped exactly (the
    released one is 108 tokens of the real tokenizer; with the fixture tokenizer it would
    crop the prompt away), 24 prompt tokens, 16 ByT5 tokens and 4 (zero) image tokens instead
    of 256 and 729, which make most of the tiny model's compute."""
    from diffusers import ClassifierFreeGuidance

    pipe.guider = ClassifierFreeGuidance(guidance_scale=g)
    pipe.system_message = HUNYUAN_SYSTEM
    prefix = f"<|im_start|>system\n{HUNYUAN_SYSTEM}<|im_end|>\n<|im_start|>user\n"
    pipe.prompt_template_encode_start_idx = len(pipe.tokenizer(prefix).input_ids)
    pipe.tokenizer_max_length = 24
    pipe.tokenizer_2_max_length = 16
    pipe.vision_num_semantic_tokens = 4


VIDEO_FAMILIES: dict[str, Family] = {
    "ltx": Family(
        build_ltx,
        plain_cfg,
        # Decoded at LTX-Video 0.9.1's recommended decode timestep and noise, the noise seeded.
        {"max_sequence_length": 16, "decode_timestep": 0.05, "decode_noise_scale": 0.025},
        {"max_sequence_length": 16, "decode_timestep": 0.05, "decode_noise_scale": 0.025},
        size=VIDEO,
    ),
    "hunyuan_video15": Family(
        build_hunyuan_video15,
        lambda g: {},
        {"max_sequence_length": 24},
        size=VIDEO,
        configure=configure_hunyuan,
    ),
}
ALL_FAMILIES = {**FAMILIES, **VIDEO_FAMILIES}
# Stock-call keywords that are not adapter settings.
CALL_ONLY = {"sana": {"use_resolution_binning": False}}


def family_kwargs(family: str, guidance: float = 1.0) -> dict[str, Any]:
    """Adapter keywords; for a guidance-embedding family, with the embedding set to the stock
    call's ``guidance`` (so that both sides guide alike)."""
    description = ALL_FAMILIES[family]
    embedded = {"embedded_guidance": guidance} if description.embedded_guidance else {}
    return {**description.size, **description.policy, **embedded}


def sampler_guidance(family: str, guidance: float) -> float:
    """Our rollouts' CFG scale matching the stock call at ``guidance`` (1 for a family whose
    guidance is an embedding, set by ``family_kwargs``)."""
    return 1.0 if ALL_FAMILIES[family].embedded_guidance else guidance


def pipe_call(
    policy: Any,
    family: str,
    noise: torch.Tensor,
    guidance: float,
    output_type: str,
    steps: int = 4,
    prompts: list[str] | None = None,
    **extra: Any,
) -> torch.Tensor:
    """The stock pipeline's own ``__call__`` with settings equal to the adapter's (a video
    family's decode noise from the adapter's seed)."""
    description = ALL_FAMILIES[family]
    kwargs = {**description.call, **CALL_ONLY.get(family, {}), **description.stock_cfg(guidance)}
    if description.configure is not None:
        description.configure(policy.pipe, guidance)
    if family in VIDEO_FAMILIES and output_type != "latent":
        kwargs["generator"] = torch.Generator().manual_seed(policy.decode_noise_seed)
    policy.pipe.set_progress_bar_config(disable=True)
    if description.stock_noise is not None:
        noise = description.stock_noise(policy, noise)
    output = policy.pipe(
        prompt=list(PROMPTS if prompts is None else prompts),  # a copy: ZImage templates it
        latents=noise.clone(),
        num_inference_steps=steps,
        output_type=output_type,
        **description.size,
        **kwargs,
        **extra,
    )
    images = output.frames if family in VIDEO_FAMILIES else output.images
    if output_type == "latent" and description.stock_latents is not None:
        return description.stock_latents(policy, images)
    return images
