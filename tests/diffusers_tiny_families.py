"""Tiny random Lumina2 and QwenImage pipelines, built offline (see diffusers_tiny.py for the rest).

Sizes, for a 32x32 image:

    Lumina2    Lumina2Pipeline fixes vae_scale_factor = 8: a 4-level KL VAE (4 latent channels),
               latents (4, 4, 4), 2x2 patches -> 4 image tokens; Gemma2 (32) text encoder whose
               penultimate hidden state is the condition, padded to max_sequence_length.
    QwenImage  AutoencoderKLQwenImage with 3 levels (8x spatial: vae_scale_factor is
               2 ** len(temperal_downsample)), 4 latent channels with per-channel latent
               statistics, latents packed into 2x2 patches -> (4, 16); a Qwen2.5-VL text
               encoder (2-layer language model, 1-layer vision tower) with the fixture Qwen2
               tokenizer, whose split of the pipeline's chat template matches the real one (the
               pipeline drops its first 34 tokens). Prompt embeddings are as long as the longest
               prompt of a batch, with a mask.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler
from diffusers_tiny import FIXTURES, gemma_tokenizer
from transformers import Gemma2Config, Gemma2Model, Qwen2Tokenizer

# Released checkpoints' values (vae/config.json, scheduler/scheduler_config.json):
# Lumina-Image-2.0 uses FLUX's VAE and a static shift of 6; Qwen-Image's scheduler shifts by
# resolution (base_shift 0.5, max_shift 0.9, exponential time shift, shift_terminal 0.02).
LUMINA_VAE_SCALE, LUMINA_VAE_SHIFT = 0.3611, 0.1159


def qwen2_tokenizer() -> Qwen2Tokenizer:
    """Byte-level BPE Qwen2 tokenizer with the chat and vision markers as special tokens; pad =
    eos = ``<|endoftext|>`` as in Qwen2.5-VL."""
    directory = FIXTURES / "qwen2_tokenizer"
    vocab = json.loads((directory / "vocab.json").read_text())
    lines = (directory / "merges.txt").read_text().splitlines()
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#")]
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges)
    markers = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [*markers, "<|image_pad|>"]}  # type: ignore[dict-item]
    )
    tokenizer.image_token = "<|image_pad|>"  # what Qwen2VLProcessor expands per image patch
    return tokenizer


def build_lumina2(directory: Path) -> Path:
    """Lumina2Pipeline: Gemma2 (32) text encoder, 8x KL VAE, a 1+1-layer Lumina2 DiT."""
    from diffusers import Lumina2Pipeline, Lumina2Transformer2DModel

    torch.manual_seed(0)
    tokenizer = gemma_tokenizer()
    text_encoder = Gemma2Model(
        Gemma2Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            query_pre_attn_scalar=16,
            max_position_embeddings=1024,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
            attn_implementation="eager",
        )
    )
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
        scaling_factor=LUMINA_VAE_SCALE,
        shift_factor=LUMINA_VAE_SHIFT,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    transformer = Lumina2Transformer2DModel(
        sample_size=4,  # 32 px / 8
        patch_size=2,
        in_channels=4,
        hidden_size=32,
        num_layers=2,
        num_refiner_layers=1,
        num_attention_heads=4,
        num_kv_heads=2,
        multiple_of=16,
        axes_dim_rope=(4, 2, 2),  # sums to the head dimension 32 / 4
        axes_lens=(300, 32, 32),
        cap_feat_dim=32,  # the Gemma2 hidden size
    )
    pipe = Lumina2Pipeline(
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=6.0),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def build_qwenimage(directory: Path) -> Path:
    """QwenImagePipeline: Qwen2.5-VL (32) text encoder, 3-level Qwen-Image VAE (8x), a 2-layer
    MM-DiT over 2x2-packed latents, and Qwen-Image's resolution-dependent scheduler."""
    from diffusers import QwenImagePipeline

    torch.manual_seed(0)
    tokenizer = qwen2_tokenizer()
    pipe = QwenImagePipeline(
        scheduler=_qwen_scheduler(),
        vae=_qwen_vae(),
        text_encoder=_qwen_text_encoder(tokenizer),
        tokenizer=tokenizer,
        transformer=_qwen_transformer(),
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def build_qwenimage_edit(directory: Path) -> Path:
    """QwenImageEditPipeline: the QwenImage components plus a Qwen2-VL processor whose images
    reach the text encoder at 16-32 px (min/max_pixels); the reference image itself is resized
    to ~1024x1024 by the pipeline and VAE-encoded (64 x 64 reference tokens)."""
    from diffusers import QwenImageEditPipeline
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    torch.manual_seed(0)
    tokenizer = qwen2_tokenizer()
    sizes = dict(min_pixels=16 * 16, max_pixels=32 * 32, patch_size=4, merge_size=2)
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**sizes, temporal_patch_size=2),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(**sizes, temporal_patch_size=2),
    )
    pipe = QwenImageEditPipeline(
        scheduler=_qwen_scheduler(),
        vae=_qwen_vae(),
        text_encoder=_qwen_text_encoder(tokenizer),
        tokenizer=tokenizer,
        processor=processor,
        transformer=_qwen_transformer(),
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def _qwen_text_encoder(tokenizer: Qwen2Tokenizer) -> Any:
    """Qwen2.5-VL: a 2-layer language model (32) and a 1-layer vision tower (patch 4, 2x2
    merge) whose image token ids are the tokenizer's."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = tokenizer.convert_tokens_to_ids
    text = dict(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4},
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    vision = dict(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
        patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        fullatt_block_indexes=[0], window_size=16,
    )  # fmt: skip
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    return Qwen2_5_VLForConditionalGeneration(config)


def _qwen_vae() -> Any:
    """Qwen-Image's video VAE, 3 levels (8x), 4 channels with per-channel statistics."""
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage(
        base_dim=4,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1, -0.2, 0.3, 0.0],
        latents_std=[1.5, 0.8, 2.0, 1.2],
    )


def _qwen_transformer() -> Any:
    """A 2-layer MM-DiT over 2x2-packed latents (16 = 4 channels x 4)."""
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,  # 4 latent channels x 2x2 packing
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,  # the text encoder's hidden size
        axes_dims_rope=(4, 6, 6),  # sums to attention_head_dim
    )


def _qwen_scheduler() -> FlowMatchEulerDiscreteScheduler:
    """Qwen-Image's: resolution-dependent exponential shift, terminal sigma 0.02."""
    return FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256,
        base_shift=0.5,
        max_image_seq_len=8192,
        max_shift=0.9,
        shift=1.0,
        shift_terminal=0.02,
        time_shift_type="exponential",
        use_dynamic_shifting=True,
    )


# Qwen3's chat template, reduced to what ZImagePipeline uses: one user turn, the generation
# prompt, and (enable_thinking=True) no empty thinking block.
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


def build_zimage(directory: Path) -> Path:
    """ZImagePipeline: Qwen3 (32) text encoder with the fixture Qwen2 tokenizer and a chat
    template, a 4x KL VAE (vae_scale_factor is 2 ** (levels - 1)), a 1+1-layer Z-Image DiT."""
    from diffusers import ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(0)
    tokenizer = qwen2_tokenizer()
    tokenizer.chat_template = QWEN3_TEMPLATE
    text_encoder = Qwen3Model(
        Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=1024,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
        scaling_factor=LUMINA_VAE_SCALE,  # Z-Image uses FLUX's VAE too
        shift_factor=LUMINA_VAE_SHIFT,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    transformer = ZImageTransformer2DModel(
        in_channels=4,
        dim=32,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        cap_feat_dim=32,  # the Qwen3 hidden size
        axes_dims=[4, 6, 6],  # sums to the head dimension 32 / 2
        axes_lens=[1024, 64, 64],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False)
    pipe = ZImagePipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def build_chroma(directory: Path) -> Path:
    """ChromaPipeline: T5 (32) text encoder, FLUX's 4x KL VAE layout with 2x2 packing, a
    1+1-layer Chroma transformer with a small distilled-modulation approximator."""
    from diffusers import ChromaPipeline, ChromaTransformer2DModel
    from diffusers_tiny import FLUX_VAE_SCALE, FLUX_VAE_SHIFT, _t5_encoder, _vae_kl, t5_tokenizer

    torch.manual_seed(0)
    tokenizer = t5_tokenizer()
    transformer = ChromaTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(4, 6, 6),
        approximator_num_channels=8,
        approximator_hidden_dim=32,
        approximator_layers=1,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15
    )
    pipe = ChromaPipeline(
        scheduler=scheduler,
        vae=_vae_kl(FLUX_VAE_SCALE, FLUX_VAE_SHIFT),
        text_encoder=_t5_encoder(tokenizer, 32),
        tokenizer=tokenizer,
        transformer=transformer,
    )
    pipe.save_pretrained(directory)
    return Path(directory)
