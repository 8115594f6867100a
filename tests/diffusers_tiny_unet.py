"""Tiny random Stable Diffusion and SDXL pipelines (UNet, epsilon / v prediction), built offline.

Every component type and the wiring of the released checkpoints, with random weights: SD's CLIP
text encoder (width 16) feeds the UNet's cross-attention; SDXL's two encoders (16 and 24 wide,
the second with a projection) give 40-wide token embeddings, a 24-wide pooled embedding and,
with the six size ids of ``addition_time_embed_dim`` 8, the UNet's ``text_time`` embedding input
``6 * 8 + 24 = 72``. The VAE downsamples by 4 (32x32 images, 8x8 latents). The schedulers are
the released ones' DDIM settings (scaled-linear betas 0.00085-0.012, steps_offset 1,
set_alpha_to_one False, clip_sample False). Tokenizers come from tests/fixtures.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from diffusers_tiny import _clip_config, clip_tokenizer
from transformers import CLIPTextModel, CLIPTextModelWithProjection

SD_VAE_SCALE = 0.18215  # vae/config.json of SD 1.5
SDXL_VAE_SCALE = 0.13025  # of SDXL base


def ddim_scheduler(prediction_type: str = "epsilon") -> DDIMScheduler:
    return DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        prediction_type=prediction_type,
    )


def _vae(scaling_factor: float) -> AutoencoderKL:
    """SD's KL autoencoder (with quant convs), 4x downsampling, 4 latent channels."""
    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
        scaling_factor=scaling_factor,
    )


def _unet(cross_attention_dim: int, **kwargs) -> UNet2DConditionModel:
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(8, 16),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=cross_attention_dim,
        attention_head_dim=4,
        norm_num_groups=4,
        **kwargs,
    )


def build_sd(directory: Path, prediction_type: str = "epsilon") -> Path:
    """StableDiffusionPipeline (SD 1.5 layout; ``v_prediction`` gives SD 2.x's), no safety
    checker; 32x32 images by default."""
    torch.manual_seed(0)
    tokenizer = clip_tokenizer()
    pipe = StableDiffusionPipeline(
        vae=_vae(SD_VAE_SCALE),
        text_encoder=CLIPTextModel(_clip_config(tokenizer, 16)),
        tokenizer=tokenizer,
        unet=_unet(16),
        scheduler=ddim_scheduler(prediction_type),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def build_sdxl(directory: Path) -> Path:
    """StableDiffusionXLPipeline (SDXL base layout, force_zeros_for_empty_prompt)."""
    torch.manual_seed(0)
    tokenizer = clip_tokenizer()
    pipe = StableDiffusionXLPipeline(
        vae=_vae(SDXL_VAE_SCALE),
        text_encoder=CLIPTextModel(_clip_config(tokenizer, 16)),
        text_encoder_2=CLIPTextModelWithProjection(_clip_config(tokenizer, 24)),
        tokenizer=tokenizer,
        tokenizer_2=clip_tokenizer(),
        unet=_unet(
            16 + 24,
            addition_embed_type="text_time",
            addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=6 * 8 + 24,
            use_linear_projection=True,
        ),
        scheduler=ddim_scheduler(),
        force_zeros_for_empty_prompt=True,
    )
    pipe.save_pretrained(directory)
    return Path(directory)
