"""The OCR reward (reward_models/ocr.py): Flow-GRPO's scoring rule on hand-computed cases, and a
tiny random TrOCR-style VisionEncoderDecoderModel saved and loaded offline as the reader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers_tiny_families import qwen2_tokenizer

from reward_models import build_reward
from reward_models.ocr import levenshtein, ocr_score, quoted_text


def test_levenshtein_by_hand() -> None:
    assert levenshtein("kitten", "sitting") == 3  # k->s, e->i, +g
    assert levenshtein("", "abc") == 3 and levenshtein("abc", "abc") == 0
    assert levenshtein("flaw", "lawn") == 2


def test_ocr_score_follows_flow_grpo_rule() -> None:
    assert ocr_score("Hello World", "hello world") == 1.0  # case and spaces ignored
    assert ocr_score("xxHELLOworldyy", "Hello World") == 1.0  # target inside the reading
    assert ocr_score("helo world", "hello world") == pytest.approx(1 - 1 / 10)  # 1 deletion
    assert ocr_score("sitting", "kitten") == pytest.approx(1 - 3 / 6)
    assert ocr_score("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    assert ocr_score("", "abc") == 0.0  # distance 3 of 3
    assert ocr_score("z" * 20, "abc") == 0.0  # distance 20, capped at len("abc")
    assert ocr_score("", "") == 1.0 and ocr_score("a", "") == 0.0  # verl-omni's empty target


def test_quoted_text_is_the_first_quoted_span() -> None:
    assert quoted_text('A neon sign reading "Open Late" above a door') == "Open Late"
    assert quoted_text('"A" and "B"') == "A"
    with pytest.raises(ValueError, match="quotes no text"):
        quoted_text("a cat without quotes")


def build_tiny_reader(directory: Path) -> Path:
    """ViT encoder + TrOCR decoder (width 16) whose output projection is zero, so every logit
    ties and greedy decoding emits token 0 ("!" in the fixture vocabulary) at every step."""
    from transformers import (
        TrOCRConfig,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
    )

    torch.manual_seed(0)
    tokenizer = qwen2_tokenizer()
    tokenizer.add_special_tokens({"bos_token": "<|im_start|>"})
    encoder = ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        image_size=32, patch_size=8,
    )  # fmt: skip
    decoder = TrOCRConfig(
        vocab_size=len(tokenizer), d_model=16, decoder_layers=1, decoder_attention_heads=2,
        decoder_ffn_dim=32, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = tokenizer.bos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    model = VisionEncoderDecoderModel(config=config)
    with torch.no_grad():
        model.decoder.output_projection.weight.zero_()
    model.generation_config.decoder_start_token_id = tokenizer.bos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_ocr_reward_reads_with_a_vision_encoder_decoder(tmp_path: Path) -> None:
    directory = build_tiny_reader(tmp_path / "reader")
    reward = build_reward("ocr", model=str(directory), max_new_tokens=4)
    images = torch.rand(3, 3, 48, 40, generator=torch.Generator().manual_seed(0))
    prompts = ['a sign saying "!!!!"', 'a sign saying "!?!!"', 'a mug with "ab"']
    out = reward(images, prompts, [{}, {}, {"ocr_text": "!! !"}])
    # The reader emits "!!!!" (4 steps of token 0) for every image.
    assert [row["ocr_text"] for row in out.info or []] == ["!!!!"] * 3
    # "!!!!" vs "!!!!": 1; vs "!?!!": one substitution of 4 -> 0.75; the metadata target "!!!"
    # (spaces removed) is inside "!!!!" -> 1.
    assert out.scores["ocr"].tolist() == pytest.approx([1.0, 0.75, 1.0])
    with pytest.raises(ValueError, match="quotes no text"):
        reward(images[:1], ["no quotes here"])
    with pytest.raises(ValueError, match="scores images"):
        reward(["text"], ['"a"'])
