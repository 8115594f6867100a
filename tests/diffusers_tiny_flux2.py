"""Tiny random FLUX.2 pipelines (``Flux2Pipeline``, ``Flux2KleinPipeline``), built offline.

Sizes, for a 32x32 image: ``AutoencoderKLFlux2`` with 3 levels (``vae_scale_factor`` is
``2 ** (len(block_out_channels) - 1)`` = 4), 4 latent channels; the pipeline patchifies the
8x8 latent into 2x2 patches (16 channels, 4x4) and normalises them per patchified channel with
the VAE's BatchNorm running statistics (set here to non-trivial values), so a sample is
``[16 tokens, 16 channels]``. The transformer has one double-stream and one single-stream block.

Text encoders, both 2-layer language models of width 16 whose hidden states 1 and 2 are
stacked into the condition (``text_encoder_out_layers=(1, 2)``, joint width 32; the released
models stack layers 10/20/30 and 9/18/27):

* FLUX.2 [dev]: ``Mistral3ForConditionalGeneration`` (a Mistral language model and a 1-layer
  Pixtral vision tower, the layout diffusers' own Flux2 tests build) behind a
  ``PixtralProcessor``. The released processor's Tekken tokenizer is a byte-level BPE; the
  fixture Qwen2 byte-level BPE stands in for it, with Mistral's control tokens and a chat
  template of Mistral-Small-3.1's shape (``[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]``).
* FLUX.2 [klein]: ``Qwen3ForCausalLM`` with the fixture Qwen2 tokenizer and Qwen3's chat
  template (as in ``diffusers_tiny_families.build_zimage``); CFG with the empty prompt.

``Flux2Pipeline`` prefixes every prompt with a short system message (``pipe.system_message``,
~80 fixture tokens with the template); the tests pad to ``max_sequence_length=128``, so the
prompt survives the truncation (the pipeline's default is 512).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel
from diffusers_tiny_families import QWEN3_TEMPLATE, qwen2_tokenizer

TEXT_WIDTH = 16
OUT_LAYERS = (1, 2)  # hidden states stacked into the condition: joint width 2 * 16

# Mistral-Small-3.1's template reduced to what Flux2Pipeline sends: a system turn and one user
# turn, each a list of text parts (format_input), without the generation prompt.
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% set text = m['content'] if m['content'] is string else "
    "m['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') %}"
    "{% if m['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% elif m['role'] == 'user' %}[INST]{{ text }}[/INST]"
    "{% else %}{{ text }}{{ eos_token }}{% endif %}{% endfor %}"
)


def _transformer(guidance_embeds: bool) -> Flux2Transformer2DModel:
    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=16,  # 4 latent channels x 2x2 patches
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=TEXT_WIDTH * len(OUT_LAYERS),
        timestep_guidance_channels=256,  # fixed in the released model (diffusers' tests too)
        axes_dims_rope=(4, 4, 4, 4),  # (T, H, W, L) axes, summing to the head dimension
        guidance_embeds=guidance_embeds,
    )


def _vae() -> AutoencoderKLFlux2:
    vae = AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    # The released VAE's BatchNorm statistics are far from (0, 1); make them non-trivial so the
    # (de)normalisation is exercised.
    generator = torch.Generator().manual_seed(1)
    channels = vae.bn.running_mean.shape[0]
    vae.bn.running_mean.copy_(torch.randn(channels, generator=generator) * 0.3)
    vae.bn.running_var.copy_(torch.rand(channels, generator=generator) * 2 + 0.5)
    return vae


def _scheduler() -> FlowMatchEulerDiscreteScheduler:
    # FLUX.2's scheduler config: dynamic shifting with mu from compute_empirical_mu.
    return FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True)


def mistral_processor() -> Any:
    """A ``PixtralProcessor`` over the fixture byte-level BPE with Mistral's control tokens."""
    from transformers import PixtralImageProcessor, PixtralProcessor

    tokenizer = qwen2_tokenizer()
    controls = ["<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"]
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [*controls, "[IMG]", "[IMG_BREAK]", "[IMG_END]"]}  # type: ignore[dict-item]
    )
    tokenizer.bos_token, tokenizer.eos_token = "<s>", "</s>"
    tokenizer.padding_side = "right"
    image_processor = PixtralImageProcessor(
        size={"longest_edge": 32}, patch_size={"height": 8, "width": 8}
    )
    return PixtralProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=8,
        chat_template=MISTRAL_TEMPLATE,
    )


def _mistral3(processor: Any) -> Any:
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    tokenizer = processor.tokenizer
    ids = tokenizer.convert_tokens_to_ids
    config = Mistral3Config(
        text_config={
            "model_type": "mistral",
            "vocab_size": len(tokenizer),
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": 32,
            "max_position_embeddings": 1024,
            "num_attention_heads": 2,
            "num_hidden_layers": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "sliding_window": None,
            "bos_token_id": ids("<s>"),
            "eos_token_id": ids("</s>"),
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "model_type": "pixtral",
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "image_size": 32,
            "patch_size": 8,
            "num_channels": 3,
        },
        image_token_index=ids("[IMG]"),
        vision_feature_layer=-1,
    )
    return Mistral3ForConditionalGeneration(config)


def build_flux2(directory: Path) -> Path:
    """Flux2Pipeline (FLUX.2 [dev]): guidance-distilled transformer (guidance embedding)."""
    from diffusers import Flux2Pipeline

    torch.manual_seed(0)
    processor = mistral_processor()
    pipe = Flux2Pipeline(
        scheduler=_scheduler(),
        vae=_vae(),
        text_encoder=_mistral3(processor),
        tokenizer=processor,
        transformer=_transformer(guidance_embeds=True),
    )
    pipe.save_pretrained(directory)
    return Path(directory)


def build_flux2_klein(directory: Path) -> Path:
    """Flux2KleinPipeline (FLUX.2 [klein] base): no guidance embedding, true CFG."""
    from diffusers import Flux2KleinPipeline
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    tokenizer = qwen2_tokenizer()
    tokenizer.chat_template = QWEN3_TEMPLATE
    text_encoder = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=TEXT_WIDTH,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            max_position_embeddings=1024,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )
    pipe = Flux2KleinPipeline(
        scheduler=_scheduler(),
        vae=_vae(),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=_transformer(guidance_embeds=False),
    )
    pipe.save_pretrained(directory)
    return Path(directory)
