"""Tiny random video pipelines, built offline (see diffusers_tiny.py for Wan 2.1 and the rest).

Sizes, for 32x32 videos of 5 frames:

    LTX-Video       AutoencoderKLLTXVideo with 2x2 patches and two spatio-temporal levels (8x
                    spatial, 4x temporal compression), 4 latent channels, per-channel latent
                    statistics in its buffers over a scaling factor, timestep-conditioned
                    decoder (as LTX-Video 0.9.1+); latents (2, 4, 4) as 32 tokens of 4
                    channels; a T5 (32) text encoder padded to max_sequence_length.
    HunyuanVideo    AutoencoderKLHunyuanVideo15 (8x spatial, 4x temporal), 4 latent channels,
    1.5             latents (4, 2, 4, 4); the transformer takes 4 + 4 + 1 input channels (the
                    latents, an image-conditioning latent and its mask, zero for text-to-video);
                    a 2-layer Qwen2.5-VL language model (32) behind the fixture Qwen2 tokenizer
                    and a byte-level ByT5 encoder (16) for quoted text.
    Wan 2.2 A14B    build_wan's components with a second transformer (the low-noise expert,
                    other random weights) and ``boundary_ratio``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers_tiny import _t5_encoder, t5_tokenizer
from diffusers_tiny_families import qwen2_tokenizer


def build_ltx(directory: Path) -> Path:
    """LTXPipeline: 4 latent channels, 8x spatial and 4x temporal compression, 1x1x1
    transformer patches; 30k parameters."""
    from diffusers import AutoencoderKLLTXVideo, LTXPipeline, LTXVideoTransformer3DModel

    torch.manual_seed(0)
    tokenizer = t5_tokenizer()
    vae = AutoencoderKLLTXVideo(
        latent_channels=4,
        block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False),
        decoder_inject_noise=(False, False, False, False, False),
        upsample_residual=(False, False, False, False),
        upsample_factor=(1, 1, 1, 1),
        timestep_conditioning=True,
        patch_size=2,
        patch_size_t=1,
        scaling_factor=0.7,
    )
    with torch.no_grad():  # non-trivial statistics (persistent buffers, saved with the VAE)
        vae.latents_mean.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
        vae.latents_std.copy_(torch.tensor([1.5, 0.8, 2.0, 1.2]))
    transformer = LTXVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        num_layers=2,
        caption_channels=32,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=16,
        max_image_seq_len=256,
        base_shift=0.95,
        max_shift=2.05,
        shift_terminal=0.1,
        use_dynamic_shifting=True,
    )
    pipe = LTXPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=_t5_encoder(tokenizer, 32),
        tokenizer=tokenizer,
        transformer=transformer,
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def build_hunyuan_video15(directory: Path) -> Path:
    """HunyuanVideo15Pipeline: 4 latent channels, 8x spatial and 4x temporal compression,
    1x1x1 patches; Qwen2.5-VL text model and ByT5 glyph encoder."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        ClassifierFreeGuidance,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from transformers import (
        ByT5Tokenizer,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    torch.manual_seed(0)
    tokenizer = qwen2_tokenizer()
    tokenizer.chat_template = QWEN25_TEMPLATE
    text_encoder = Qwen2_5_VLTextModel(
        Qwen2_5_VLTextConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
            num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4},
            pad_token_id=tokenizer.pad_token_id,
        )
    )  # fmt: skip
    byt5 = ByT5Tokenizer()
    glyph_encoder = T5EncoderModel(
        T5Config(
            vocab_size=len(byt5), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
            relative_attention_num_buckets=8, relative_attention_max_distance=32,
            feed_forward_proj="gated-gelu", pad_token_id=byt5.pad_token_id,
            eos_token_id=byt5.eos_token_id, decoder_start_token_id=byt5.pad_token_id,
        )
    )  # fmt: skip
    vae = AutoencoderKLHunyuanVideo15(
        latent_channels=4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        spatial_compression_ratio=8,
        temporal_compression_ratio=4,
        scaling_factor=0.8,
    )
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=9,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=2,  # the last block drops the text stream: a second one trains its LoRA
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=32,
        text_embed_2_dim=16,
        image_embed_dim=8,
        rope_axes_dim=(2, 2, 4),
        target_size=32,
    )
    pipe = HunyuanVideo15Pipeline(
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        text_encoder_2=glyph_encoder,
        tokenizer_2=byt5,
        guider=ClassifierFreeGuidance(guidance_scale=6.0),
    )
    pipe.save_pretrained(directory)
    return Path(directory)


# Qwen2.5's chat template reduced to what HunyuanVideo15Pipeline uses: a system and a user turn
# and the generation prompt.
QWEN25_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_wan_a14b(directory: Path) -> Path:
    """WanPipeline with two experts (Wan 2.2 A14B's layout): build_wan's components, a second
    transformer of the same shape with other random weights, and ``boundary_ratio = 0.6``."""
    from diffusers import WanPipeline
    from diffusers_tiny import build_wan

    build_wan(directory)
    stock = WanPipeline.from_pretrained(str(directory))
    torch.manual_seed(1)
    low_noise: Any = type(stock.transformer)(**stock.transformer.config)
    pipe = WanPipeline(**{**stock.components, "transformer_2": low_noise}, boundary_ratio=0.6)
    pipe.save_pretrained(directory)
    return Path(directory)
