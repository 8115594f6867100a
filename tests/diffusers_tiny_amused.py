"""A tiny random aMUSEd pipeline (``AmusedPipeline``), built offline from configs.

The real checkpoints (amused/amused-256, amused/amused-512) hold a VQ-GAN with an 8192-entry
codebook, a 600M-parameter U-ViT and CLIP-L/14 with projection; this stand-in keeps every
component type and the wiring between them with random weights:

    VQModel       3 down blocks (4x downsampling), 4 latent channels, codebook of 32 entries
                  drawn N(0, 1), lookup_from_codebook (decode takes token ids, as aMUSEd's
                  VQ-GAN does)
    UVit2DModel   sample_size 8 (8x8 = 64 image tokens), vocab 33 = codebook + the mask token
    CLIP          CLIPTextModelWithProjection, 2 layers of 16 (the pipeline reads the
                  penultimate hidden state and the pooled projection)
    scheduler     AmusedScheduler(mask_token_id=32), cosine masking schedule

so images are 32x32 pixels. The tokenizer is the committed CLIP vocabulary of tests/fixtures/.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AmusedPipeline, AmusedScheduler, UVit2DModel, VQModel
from diffusers_tiny import _clip_config, clip_tokenizer
from transformers import CLIPTextModelWithProjection

CODEBOOK = 32
MASK_TOKEN = CODEBOOK  # aMUSEd's mask id is the last vocabulary entry, just past the codebook
GRID = 8  # image tokens per side
IMAGE_SIZE = 32  # pixels per side (VQ downsampling 4)


def tiny_amused_pipeline(seed: int = 0) -> AmusedPipeline:
    """The tiny pipeline in memory (random weights drawn from ``seed``)."""
    torch.manual_seed(seed)
    tokenizer = clip_tokenizer()
    vqvae = VQModel(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 8, 8),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        num_vq_embeddings=CODEBOOK,
        vq_embed_dim=4,
        sample_size=IMAGE_SIZE,
        lookup_from_codebook=True,
        force_upcast=False,
        mid_block_add_attention=False,
    )
    # Unit-scale codebook entries: with diffusers' default U(-1/K, 1/K) every token grid decodes
    # to nearly the same picture (target_color spread 0.002 over random grids), and an image
    # reward would have nothing to learn from; N(0, 1) spreads single-code images over
    # target_color 0.63-0.70.
    vqvae.quantize.embedding.weight.data.normal_(0.0, 1.0)
    transformer = UVit2DModel(
        hidden_size=16,
        cond_embed_dim=16,  # CLIP's projection_dim (the pooled text embedding)
        micro_cond_encode_dim=2,
        micro_cond_embed_dim=10,  # 5 micro-conditions x micro_cond_encode_dim
        encoder_hidden_size=16,  # CLIP's hidden size
        vocab_size=CODEBOOK + 1,
        codebook_size=CODEBOOK,
        in_channels=8,
        block_out_channels=16,
        num_res_blocks=1,
        block_num_heads=2,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        sample_size=GRID,
    )
    return AmusedPipeline(
        vqvae=vqvae,
        tokenizer=tokenizer,
        text_encoder=CLIPTextModelWithProjection(_clip_config(tokenizer, 16)),
        transformer=transformer,
        scheduler=AmusedScheduler(mask_token_id=MASK_TOKEN),
    )


def build_amused(directory: Path, seed: int = 0) -> Path:
    """``save_pretrained`` of the tiny pipeline into ``directory``."""
    tiny_amused_pipeline(seed).save_pretrained(directory)
    return Path(directory)
