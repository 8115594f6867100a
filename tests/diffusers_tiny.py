"""Tiny random diffusers pipelines (SD3, FLUX, SANA text-to-image; Wan text-to-video), built offline.

The real checkpoints are tens of GB and need the network; these stand-ins keep every component
type, the wiring between them (embedding widths, packing, latent scaling) and the schedulers'
settings, with random weights and 17k-80k parameters per model. Tokenizers come from the
committed vocabularies in tests/fixtures/ (see make_tokenizers.py there).

Sizes, for a 32x32 image (every family's VAE downsamples by 4; 64x64 also works):

    SD3   latents (1, 4, 8, 8); 2x2 patches -> 16 image tokens; default height/width 32.
    FLUX  latents (1, 4, 8, 8), packed into 2x2 patches as (1, 16, 16) for the transformer;
          pass height/width (FluxPipeline's default is 128 * vae_scale_factor = 512).
    SANA  latents (1, 4, 8, 8), patch size 1 -> 64 image tokens; height/width must be multiples
          of 32 (SanaPipeline.check_inputs).

SanaPipeline needs `use_resolution_binning=False` (binning maps the size to 512-4096 px bins from
transformer.sample_size; the tiny transformer's sample_size 8 is not a known bin, so binning
raises "Invalid sample size" rather than silently rendering 1024 px). The default
`max_sequence_length=300` and the default `complex_human_instruction` (a ~100-word prefix) both
work; `max_sequence_length=16, complex_human_instruction=None` is the fast setting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from diffusers import (
    AutoencoderDC,
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    SanaPipeline,
    SanaTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
)
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    Gemma2Config,
    Gemma2Model,
    GemmaTokenizer,
    T5Config,
    T5EncoderModel,
    T5Tokenizer,
    UMT5Config,
    UMT5EncoderModel,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Real pipelines' VAE latent statistics (vae/config.json of the released checkpoints), so that
# latent (de)normalisation code paths are exercised with realistic, non-trivial values.
SD3_VAE_SCALE, SD3_VAE_SHIFT = 1.5305, 0.0609
FLUX_VAE_SCALE, FLUX_VAE_SHIFT = 0.3611, 0.1159
SANA_VAE_SCALE = 0.41407


def clip_tokenizer() -> CLIPTokenizer:
    """Byte-level BPE CLIP tokenizer; model_max_length 77 as the pipelines pad to it."""
    directory = FIXTURES / "clip_tokenizer"
    vocab = json.loads((directory / "vocab.json").read_text())
    lines = (directory / "merges.txt").read_text().splitlines()
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#")]
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)


def t5_tokenizer() -> T5Tokenizer:
    """Unigram T5 tokenizer: <pad>=0, </s>=1, <unk>=2; no sentinel (<extra_id_N>) tokens."""
    rows = json.loads((FIXTURES / "t5_tokenizer" / "unigram.json").read_text())
    vocab = [(piece, score) for piece, score in rows]
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=512)


def gemma_tokenizer() -> GemmaTokenizer:
    """Gemma BPE tokenizer with byte fallback; adds <bos> like google/gemma-2-2b-it."""
    directory = FIXTURES / "gemma_tokenizer"
    vocab = json.loads((directory / "vocab.json").read_text())
    lines = (directory / "merges.txt").read_text().splitlines()
    merges = [tuple(line.split(" ")) for line in lines if line]
    return GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True)


def _clip_config(tokenizer: CLIPTokenizer, hidden: int) -> CLIPTextConfig:
    """Two layers, since SD3 reads the penultimate hidden state; projection_dim = hidden as
    in CLIP-L/G."""
    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        projection_dim=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=tokenizer.model_max_length,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _t5_encoder(tokenizer: T5Tokenizer, d_model: int) -> T5EncoderModel:
    """T5 v1.1-style encoder (gated GELU), the variant SD3 and FLUX use."""
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=8,
        d_ff=2 * d_model,
        num_layers=2,
        num_heads=2,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return T5EncoderModel(config)


def _vae_kl(scaling_factor: float, shift_factor: float) -> AutoencoderKL:
    """SD3/FLUX-style KL autoencoder (no quant convs), 4x downsampling, 4 latent channels."""
    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
        scaling_factor=scaling_factor,
        shift_factor=shift_factor,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def build_sd3(directory: Path) -> Path:
    """StableDiffusion3Pipeline: CLIP-L (16) + CLIP-G (24) + T5 (48); 32x32 images by default.

    The two CLIP hidden states are concatenated (40) and zero-padded to the T5 width, which is
    the transformer's joint_attention_dim; the pooled projections (16 + 24) are
    pooled_projection_dim.
    """
    torch.manual_seed(0)
    clip, t5 = clip_tokenizer(), t5_tokenizer()
    transformer = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=48,
        caption_projection_dim=32,  # must equal num_attention_heads * attention_head_dim
        pooled_projection_dim=16 + 24,
        out_channels=4,
        pos_embed_max_size=16,  # up to 128x128 images
    )
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        vae=_vae_kl(SD3_VAE_SCALE, SD3_VAE_SHIFT),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        text_encoder=CLIPTextModelWithProjection(_clip_config(clip, 16)),
        tokenizer=clip,
        text_encoder_2=CLIPTextModelWithProjection(_clip_config(clip, 24)),
        tokenizer_2=clip_tokenizer(),
        text_encoder_3=_t5_encoder(t5, 48),
        tokenizer_3=t5,
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def build_flux(directory: Path) -> Path:
    """FluxPipeline (dev-style, guidance-distilled): CLIP-L (24, pooled) + T5 (32).

    Latents (B, 4, H/4, W/4) are packed into 2x2 patches -> (B, H/8 * W/8, 16), hence the
    transformer's in_channels 16; height and width must be multiples of 8. The scheduler is
    FLUX.1's: resolution-dependent (dynamic) shift between base_shift and max_shift.
    """
    torch.manual_seed(0)
    clip, t5 = clip_tokenizer(), t5_tokenizer()
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=24,
        guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),  # sums to attention_head_dim
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    pipe = FluxPipeline(
        transformer=transformer,
        vae=_vae_kl(FLUX_VAE_SCALE, FLUX_VAE_SHIFT),
        scheduler=scheduler,
        text_encoder=CLIPTextModel(_clip_config(clip, 24)),
        tokenizer=clip,
        text_encoder_2=_t5_encoder(t5, 32),
        tokenizer_2=t5,
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def build_sana(directory: Path) -> Path:
    """SanaPipeline: Gemma2 (32) text encoder, DC-AE (4x here, 32x in SANA), linear-attention DiT.

    The scheduler is FlowMatchEulerDiscreteScheduler(shift=3.0) so that samplers can be checked
    against a plain Euler ODE; the released SANA checkpoints ship DPMSolverMultistepScheduler
    (flow_prediction, use_flow_sigmas=True, flow_shift 3.0). Call the pipeline with
    use_resolution_binning=False (see the module docstring).
    """
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
            # Gemma2's attention-logit soft-capping is only implemented by eager attention.
            attn_implementation="eager",
        )
    )
    vae = AutoencoderDC(
        latent_channels=4,
        attention_head_dim=4,
        encoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "ResBlock", "EfficientViTBlock"),
        encoder_block_out_channels=(8, 8, 16),
        decoder_block_out_channels=(8, 8, 16),
        encoder_layers_per_block=(1, 1, 1),
        decoder_layers_per_block=(1, 1, 1),
        encoder_qkv_multiscales=((), (), (5,)),
        decoder_qkv_multiscales=((), (), (5,)),
        scaling_factor=SANA_VAE_SCALE,
    )
    transformer = SanaTransformer2DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=2,
        num_cross_attention_heads=2,
        cross_attention_head_dim=8,
        cross_attention_dim=16,  # = num_attention_heads * attention_head_dim, as in SANA
        caption_channels=32,  # the Gemma2 hidden size
        sample_size=8,  # 32 px / 4; deliberately not a resolution-binning size
        patch_size=1,
    )
    pipe = SanaPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def build_wan(directory: Path) -> Path:
    """WanPipeline (Wan 2.1 layout): UMT5 (32) text encoder, causal 3D VAE with 8x spatial and
    4x temporal compression (4 latent channels, non-trivial per-channel latent statistics), and
    a 2-layer Wan transformer with 1x2x2 patches; 10k + 17k parameters.

    Sizes: 32x32 videos of 5 frames -> latents (4, 2, 4, 4) -> 2x2x2 = 8 video tokens;
    ``num_frames - 1`` must be a multiple of 4 and height/width multiples of 16.
    """
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    torch.manual_seed(0)
    tokenizer = t5_tokenizer()
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(tokenizer),
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=2,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=32,
            feed_forward_proj="gated-gelu",
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    )
    vae = AutoencoderKLWan(
        base_dim=4,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1, -0.2, 0.3, 0.0],
        latents_std=[1.5, 0.8, 2.0, 1.2],
    )
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=16,
        ffn_dim=32,
        num_layers=2,
        rope_max_seq_len=32,
    )
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def build_clip(directory: Path) -> Path:
    """A tiny CLIPModel (32 px images, 8 px patches, projection 16) with its tokenizer and image
    processor, as reward models load it (CLIPScore, PickScore)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    tokenizer = clip_tokenizer()
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 77,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    CLIPModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    processor = CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    processor.save_pretrained(directory)
    return Path(directory)


def tiny_sd3_run(directory: Path, *overrides: str) -> Any:
    """The ``sd35m_pickscore`` recipe on a tiny SD3 pipeline and a tiny CLIPScore reward built
    under ``directory`` (once): 32 px, float32 without autocast, one accumulation step, one
    held-out sample per prompt, no TensorBoard or progress bar; ``overrides`` come last."""
    from genrl import get_recipe

    config = get_recipe("sd35m_pickscore")
    config.apply_overrides([*tiny_sd3_overrides(directory), *overrides])
    return config


def tiny_sd3_overrides(directory: Path, build: bool = True) -> list[str]:
    """The ``--set`` overrides of ``tiny_sd3_run`` for ``genrl train sd35m_pickscore`` (the
    scale-out benchmark launches the CLI with them); builds the models unless ``build`` is
    False (a dry run that only prints commands)."""
    sd3, clip = directory / "sd3", directory / "clip"
    if build and not (sd3 / "model_index.json").is_file():
        build_sd3(sd3)
        build_clip(clip)
    return [
        f"policy.pretrained={sd3}",
        'policy.kwargs={"height": 32, "width": 32}',
        "reward.0.name=clipscore",
        f'reward.0.kwargs={{"model": "{clip}"}}',
        "train.gradient_accumulation_steps=1",
        "train.mixed_precision=no",
        "policy.dtype=float32",
        "eval.samples_per_prompt=1",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
    ]
