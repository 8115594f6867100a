"""The VLM families genrl's ``vlm`` policy is tested on, one row each: a builder of a tiny
random checkpoint (a few tens of thousands of parameters: hidden 32, 2 layers, 16-64 px images)
saved like a hub checkpoint with its processor, all offline (character-level tokenizers written
here, image processors constructed from their settings), and what the family's row says about
it. ``tests/test_vlm_families.py`` runs the same checks on every row.

Qwen2-VL, Gemma 3 and Idefics3 come from ``vision_tiny.py`` (their own tests there); the others
are built here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from vision_tiny import _char_tokenizer, build_gemma3, build_idefics3, build_qwen2_vl

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>"]
QWEN_SPECIALS += ["<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen2.5-VL and Qwen3-VL: 16-32 px images in patches of 4, merged 2 x 2 (4-16 tokens each).
QWEN_SIZES = dict(min_pixels=16 * 16, max_pixels=32 * 32, patch_size=4, merge_size=2)


def _qwen_parts() -> tuple[Any, dict[str, int], dict[str, Any]]:
    """A Qwen-style tokenizer (its special tokens atomic), the config's token ids, and the
    2-layer language model's settings with multimodal RoPE (sections of 2, 3, 3 frequencies)."""
    tokenizer: Any = _char_tokenizer(
        QWEN_SPECIALS,
        {
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
        pad="<|endoftext|>",
        eos="<|im_end|>",
    )
    tokenizer.chat_template = QWEN_TEMPLATE
    vocab = tokenizer.get_vocab()
    ids = dict(
        image_token_id=vocab["<|image_pad|>"], video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"],
        vision_end_token_id=vocab["<|vision_end|>"],
    )  # fmt: skip
    text = dict(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4},
        bos_token_id=None, eos_token_id=vocab["<|im_end|>"], pad_token_id=0,
    )  # fmt: skip
    return tokenizer, ids, text


def build_qwen2_5_vl(directory: Path) -> Path:
    """A tiny Qwen2.5-VL: 2-layer windowed vision tower (window 8 px, the second block full
    attention), 2-layer Qwen2 language model with multimodal RoPE."""
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
    )
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    tokenizer, ids, text = _qwen_parts()
    vision = dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
        spatial_merge_size=2, temporal_patch_size=2, window_size=8, out_hidden_size=32,
        fullatt_block_indexes=[1],
    )  # fmt: skip
    torch.manual_seed(0)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(directory)
    Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**QWEN_SIZES, temporal_patch_size=2),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(**QWEN_SIZES, temporal_patch_size=2),
        chat_template=QWEN_TEMPLATE,
    ).save_pretrained(directory)
    return directory


def build_qwen3_vl(directory: Path) -> Path:
    """A tiny Qwen3-VL: 2-layer vision tower with learnt position embeddings and one DeepStack
    layer (its features added to the language model's first layer), 2-layer Qwen3 language
    model with interleaved multimodal RoPE."""
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
    )
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer, ids, text = _qwen_parts()
    rope = {**text["rope_parameters"], "mrope_interleaved": True}
    text = dict(text, head_dim=16, rope_parameters=rope)
    vision = dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
        spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=32,
        num_position_embeddings=64, deepstack_visual_indexes=[0],
    )  # fmt: skip
    torch.manual_seed(0)
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **ids)
    Qwen3VLForConditionalGeneration(config).save_pretrained(directory)
    Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**QWEN_SIZES, temporal_patch_size=2),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(**QWEN_SIZES, temporal_patch_size=2),
        chat_template=QWEN_TEMPLATE,
    ).save_pretrained(directory)
    return directory


LLAVA_TEMPLATE = (
    "{% for m in messages %}USER: {% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>\n{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %} ASSISTANT:{% endif %}"
)


def build_llava_next(directory: Path) -> Path:
    """A tiny LLaVA-NeXT (AnyRes): CLIP vision tower 32 px / patch 8, images tiled on the best
    of three grid pinpoints (32 x 32, 32 x 64, 64 x 32) plus a 32 px global view, 2-layer
    Llama."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )

    specials = ["<pad>", "<eos>", "<image>"]
    tokenizer: Any = _char_tokenizer(specials, {"image_token": "<image>"}, pad="<pad>", eos="<eos>")
    tokenizer.chat_template = LLAVA_TEMPLATE
    vocab = tokenizer.get_vocab()
    pinpoints = [[32, 32], [32, 64], [64, 32]]
    torch.manual_seed(0)
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=32, patch_size=8,
    )  # fmt: skip
    text = LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, pad_token_id=0, eos_token_id=1,
        bos_token_id=None,
    )  # fmt: skip
    config = LlavaNextConfig(
        vision_config=vision, text_config=text, image_token_index=vocab["<image>"],
        vision_feature_layer=-1, vision_feature_select_strategy="default",
        image_grid_pinpoints=pinpoints, image_seq_length=16,
    )  # fmt: skip
    LlavaNextForConditionalGeneration(config).save_pretrained(directory)
    LlavaNextProcessor(
        image_processor=LlavaNextImageProcessor(
            size={"shortest_edge": 32},
            crop_size={"height": 32, "width": 32},
            image_grid_pinpoints=pinpoints,
        ),
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=LLAVA_TEMPLATE,
    ).save_pretrained(directory)
    return directory


def build_paligemma(directory: Path) -> Path:
    """A tiny PaliGemma: SigLIP vision tower 32 px / patch 8 (16 image tokens), 2-layer Gemma,
    prefix-LM attention; its processor at 32 px and, like the hub's, no chat template."""
    from transformers import (
        PaliGemmaConfig,
        PaliGemmaForConditionalGeneration,
        PaliGemmaProcessor,
        SiglipImageProcessor,
    )

    specials = ["<pad>", "<eos>", "<bos>", "<image>"]
    tokenizer: Any = _char_tokenizer(specials, {"image_token": "<image>"}, pad="<pad>", eos="<eos>")
    tokenizer.bos_token = "<bos>"
    vocab = tokenizer.get_vocab()
    torch.manual_seed(0)
    vision = dict(
        model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
        projection_dim=32,
    )  # fmt: skip
    text = dict(
        model_type="gemma", vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=512, pad_token_id=0, eos_token_id=vocab["<eos>"],
        bos_token_id=vocab["<bos>"],
    )  # fmt: skip
    config = PaliGemmaConfig(
        vision_config=vision, text_config=text, image_token_index=vocab["<image>"],
        projection_dim=32, hidden_size=32, vocab_size=len(vocab),
    )  # fmt: skip
    PaliGemmaForConditionalGeneration(config).save_pretrained(directory)
    image_processor = SiglipImageProcessor(size={"height": 32, "width": 32})
    image_processor.image_seq_length = 16  # (32 / 8) ** 2 patches, each an image token
    PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(
        directory
    )
    return directory


SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:"
    "{% endif %}"
)


def build_smolvlm(directory: Path) -> Path:
    """A tiny SmolVLM: 2-layer SigLIP-style vision model 32 px / patch 8, pixel-shuffled by 2
    to 4 tokens per tile, images split into 32 px tiles (longest edge resized to 64 px) plus a
    global view; 2-layer Llama. Its processor needs ``num2words`` for video prompts only (the
    caller provides it: ``smolvlm_without_num2words``)."""
    from transformers import (
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
    )
    from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor

    specials = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>"]
    specials += ["<fake_token_around_image>", "<image>", "<global-img>"]
    specials += [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
    tokenizer: Any = _char_tokenizer(
        specials,
        {
            "image_token": "<image>",
            "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
        pad="<|endoftext|>",
        eos="<end_of_utterance>",
    )
    tokenizer.chat_template = SMOLVLM_TEMPLATE
    vocab = tokenizer.get_vocab()
    torch.manual_seed(1)  # not Idefics3's weights (the architecture is the same)
    text = dict(
        model_type="llama", vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=512, pad_token_id=0, eos_token_id=vocab["<end_of_utterance>"],
        bos_token_id=None,
    )  # fmt: skip
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=32, patch_size=8,
    )  # fmt: skip
    config = SmolVLMConfig(
        text_config=text, vision_config=vision, scale_factor=2, image_token_id=vocab["<image>"],
        pad_token_id=0,
    )  # fmt: skip
    SmolVLMForConditionalGeneration(config).save_pretrained(directory)
    sizes = dict(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(**sizes, do_image_splitting=True),
        tokenizer=tokenizer,
        video_processor=SmolVLMVideoProcessor(**sizes),
        image_seq_len=4,
        chat_template=SMOLVLM_TEMPLATE,
    ).save_pretrained(directory)
    return directory


def no_num2words(number: int) -> str:
    """Stands in for ``num2words``, which SmolVLM's processor requires at construction but
    calls only to write a video's frame count (these tests send images only)."""
    raise AssertionError(f"num2words({number}) called: the tests send no video")


@dataclass(frozen=True)
class Family:
    """One row of the table.

    Attributes:
        name: the family (the test ids).
        build: writes the tiny checkpoint and its processor to a directory.
        prefix_suffix: whether the stock processor marks a completion with a ``suffix``
            (PaliGemma's prefix-LM: the completion is encoded as ``suffix=`` text).
    """

    name: str
    build: Callable[[Path], Path]
    prefix_suffix: bool = False


FAMILIES = [
    Family("qwen2_vl", build_qwen2_vl),
    Family("qwen2_5_vl", build_qwen2_5_vl),
    Family("qwen3_vl", build_qwen3_vl),
    Family("llava_next", build_llava_next),
    Family("idefics3", build_idefics3),
    Family("smolvlm", build_smolvlm),
    Family("gemma3", build_gemma3),
    Family("paligemma", build_paligemma, prefix_suffix=True),
]
