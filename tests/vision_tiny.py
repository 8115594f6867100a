"""Tiny random vision backbones saved like hub checkpoints (offline), for the reward tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def build_dinov2(directory: Path, image_size: int = 32, registers: int = 0) -> Path:
    """A 2-layer DINOv2 (hidden 32, patch 8) with a BiT image processor (short side
    ``image_size + 4``, centre crop ``image_size``), saved to ``directory``."""
    import json

    from transformers import (
        Dinov2Config,
        Dinov2Model,
        Dinov2WithRegistersConfig,
        Dinov2WithRegistersModel,
    )

    torch.manual_seed(0)
    options = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=image_size,
        patch_size=8,
    )
    if registers:
        model = Dinov2WithRegistersModel(
            Dinov2WithRegistersConfig(num_register_tokens=registers, **options)
        )
    else:
        model = Dinov2Model(Dinov2Config(**options))
    model.save_pretrained(directory)
    # Written as JSON (what the hub ships) rather than through BitImageProcessor, whose class
    # differs between transformers 4 and 5.
    processor = {
        "image_processor_type": "BitImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": image_size + 4},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": image_size, "width": image_size},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
        "do_convert_rgb": True,
    }
    (directory / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))
    return directory


def write_images(directory: Path, images: torch.Tensor, prefix: str = "ref") -> list[Path]:
    """Save ``[B, 3, H, W]`` images in ``[0, 1]`` as PNGs; returns their paths."""
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        array = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        path = directory / f"{prefix}{i}.png"
        Image.fromarray(array).save(path)
        paths.append(path)
    return paths


def build_llava(directory: Path) -> Path:
    """A tiny LLaVA (CLIP vision tower 32 px / patch 8, 2-layer Llama) with a word-level
    tokenizer that knows "Yes"/"No", a chat template and its processor, saved to ``directory``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    words = ["<pad>", "<eos>", "<image>", "Yes", "No", "yes", "no", "USER:", "ASSISTANT:"]
    words += ["Does", "this", "image", "contain", "artifacts?", "Answer", "or"]
    vocab = {w: i for i, w in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="or"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        extra_special_tokens={"image_token": "<image>"},
    )
    template = (
        "{% for m in messages %}USER: {% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }} {% endif %}"
        "{% endfor %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    )
    tokenizer.chat_template = template
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
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=vocab["<image>"],
        vision_feature_layer=-1, vision_feature_select_strategy="default",
    )  # fmt: skip
    LlavaForConditionalGeneration(config).save_pretrained(directory)
    LlavaProcessor(
        image_processor=CLIPImageProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        ),
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=template,
    ).save_pretrained(directory)
    return directory


TINY_OPEN_CLIP = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def build_tiny_hps(directory: Path) -> dict[str, str]:
    """A tiny open_clip model (``tiny-hps``) registered from a config file and saved like an HPS
    checkpoint (``{"state_dict": ...}``); returns the ``hps`` reward's keyword arguments."""
    import json

    import open_clip

    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "tiny-hps.json"
    config.write_text(json.dumps(TINY_OPEN_CLIP))
    open_clip.add_model_config(str(config))
    torch.manual_seed(0)
    model = open_clip.create_model("tiny-hps", pretrained=None)
    torch.save({"state_dict": model.state_dict()}, directory / "hps.pt")
    return {
        "checkpoint": str(directory / "hps.pt"),
        "architecture": "tiny-hps",
        "model_config": str(config),
    }


def build_qwen2_vl(directory: Path) -> Path:
    """A tiny Qwen2-VL (2-layer vision tower, patch 4, 2x2 merge; 2-layer Qwen2 language model
    with multimodal RoPE) with a character-level tokenizer that has Qwen's special tokens, the
    Qwen2-VL image and video processors (16-32 px images) and a Qwen-style chat template; 74k
    parameters, saved to ``directory``."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
    )
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>"]
    specials += ["<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    chars = list(string.ascii_letters + string.digits + string.punctuation + " \n")
    vocab = {token: i for i, token in enumerate(specials + chars)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=specials[1:],
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
    )
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
        "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
        "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
        "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tokenizer.chat_template = template
    torch.manual_seed(0)
    text = dict(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4},
        bos_token_id=None, eos_token_id=vocab["<|im_end|>"], pad_token_id=0,
    )  # fmt: skip
    vision = dict(
        depth=2, embed_dim=32, hidden_size=32, num_heads=2, patch_size=4, spatial_merge_size=2,
        temporal_patch_size=2, in_channels=3,
    )  # fmt: skip
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=vocab["<|image_pad|>"],
        video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"],
        vision_end_token_id=vocab["<|vision_end|>"],
    )
    Qwen2VLForConditionalGeneration(config).save_pretrained(directory)
    sizes = dict(min_pixels=16 * 16, max_pixels=32 * 32, patch_size=4, merge_size=2)
    Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**sizes, temporal_patch_size=2),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(**sizes, temporal_patch_size=2),
        chat_template=template,
    ).save_pretrained(directory)
    return directory


def _char_tokenizer(specials: list[str], extra: dict[str, str], pad: str, eos: str) -> object:
    """A character-level fast tokenizer whose vocabulary starts with ``specials``."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(string.ascii_letters + string.digits + string.punctuation + " \n")
    vocab = {token: i for i, token in enumerate(specials + chars)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(specials)  # matched whole, before the characters
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=pad, eos_token=eos, extra_special_tokens=extra
    )


def build_gemma3(directory: Path) -> Path:
    """A tiny Gemma 3 (2-layer SigLIP 32 px / patch 8, pooled to 4 tokens per image; 2-layer
    Gemma 3 language model, one sliding and one full attention layer) with a character-level
    tokenizer that has Gemma 3's special image tokens and adds ``<bos>``, its image processor
    at 32 px and a Gemma-style chat template that starts with ``<bos>``, saved to
    ``directory``."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
    )

    specials = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
    specials += ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    tokenizer: Any = _char_tokenizer(
        specials,
        {
            "image_token": "<image_soft_token>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
        },
        pad="<pad>",
        eos="<end_of_turn>",
    )
    vocab = tokenizer.get_vocab()
    # As Gemma 3's: the tokenizer adds <bos>, and the template writes it too (the processor's
    # chat path then tokenizes without special tokens).
    tokenizer.bos_token = "<bos>"
    tokenizer.add_bos_token = True
    template = (
        "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
        "{% if m['content'] is string %}"
        "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
        "<start_of_image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
        "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    )
    tokenizer.chat_template = template
    torch.manual_seed(0)
    text = dict(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
        max_position_embeddings=512, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        pad_token_id=0, eos_token_id=vocab["<end_of_turn>"], bos_token_id=vocab["<bos>"],
    )  # fmt: skip
    vision = dict(
        model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
    )  # fmt: skip
    config = Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4,
        boi_token_index=vocab["<start_of_image>"], eoi_token_index=vocab["<end_of_image>"],
        image_token_index=vocab["<image_soft_token>"],
    )  # fmt: skip
    Gemma3ForConditionalGeneration(config).save_pretrained(directory)
    Gemma3Processor(
        image_processor=Gemma3ImageProcessor(size={"height": 32, "width": 32}),
        tokenizer=tokenizer,
        chat_template=template,
        image_seq_length=4,
    ).save_pretrained(directory)
    return directory


def build_idefics3(directory: Path) -> Path:
    """A tiny Idefics3 (SmolVLM's architecture: 2-layer SigLIP-style vision model 32 px / patch 8,
    pixel-shuffled by 2 to 4 tokens per tile; 2-layer Llama) with a character-level tokenizer
    that has Idefics3's image tokens, its image processor splitting images into 32 px tiles
    (longest edge resized to 64 px) and a SmolVLM-style chat template, saved to ``directory``."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
    )

    specials = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>"]
    specials += ["<fake_token_around_image>", "<image>", "<global-img>"]
    specials += [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
    tokenizer: Any = _char_tokenizer(
        specials, {"image_token": "<image>"}, pad="<|endoftext|>", eos="<end_of_utterance>"
    )
    vocab = tokenizer.get_vocab()
    template = (
        "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:"
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
        "{% endif %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:"
        "{% endif %}"
    )
    tokenizer.chat_template = template
    torch.manual_seed(0)
    text = dict(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        pad_token_id=0, eos_token_id=vocab["<end_of_utterance>"], bos_token_id=None,
    )  # fmt: skip
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=32, patch_size=8,
    )  # fmt: skip
    config = Idefics3Config(
        text_config={"model_type": "llama", **text}, vision_config=vision, scale_factor=2,
        image_token_id=vocab["<image>"], pad_token_id=0,
    )  # fmt: skip
    Idefics3ForConditionalGeneration(config).save_pretrained(directory)
    Idefics3Processor(
        image_processor=Idefics3ImageProcessor(
            size={"longest_edge": 64}, max_image_size={"longest_edge": 32}, do_image_splitting=True
        ),
        tokenizer=tokenizer,
        image_seq_len=4,
        chat_template=template,
    ).save_pretrained(directory)
    return directory
