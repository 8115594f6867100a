"""The tiny offline SD3/FLUX/SANA pipelines and fixture tokenizers load, round-trip and run.

Other tests build on diffusers_tiny; these pin what they rely on: committed vocabularies that the
script regenerates byte for byte, deterministic builds, save -> from_pretrained -> generate, and
the latent shapes documented in diffusers_tiny's docstring.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import (
    ChromaPipeline,
    DiffusionPipeline,
    FluxPipeline,
    Lumina2Pipeline,
    QwenImagePipeline,
    SanaPipeline,
    StableDiffusion3Pipeline,
    ZImagePipeline,
)
from diffusers_tiny import (
    FIXTURES,
    build_flux,
    build_sana,
    build_sd3,
    clip_tokenizer,
    gemma_tokenizer,
    t5_tokenizer,
)
from diffusers_tiny_families import (
    build_chroma,
    build_lumina2,
    build_qwenimage,
    build_zimage,
    qwen2_tokenizer,
)

PROMPT = "a photo of a red cat"

# family: (builder, pipeline class, extra call kwargs, latent shape for a 32x32 image)
FAMILIES: dict[
    str, tuple[Callable[[Path], Path], type[DiffusionPipeline], dict[str, Any], tuple]
] = {
    "sd3": (build_sd3, StableDiffusion3Pipeline, {"max_sequence_length": 16}, (1, 4, 8, 8)),
    # FLUX latents come back packed: (batch, (32/4/2)**2 patches, 4 channels * 2 * 2).
    "flux": (build_flux, FluxPipeline, {"max_sequence_length": 16}, (1, 16, 16)),
    "sana": (
        build_sana,
        SanaPipeline,
        {
            "max_sequence_length": 16,
            "complex_human_instruction": None,
            "use_resolution_binning": False,
        },
        (1, 4, 8, 8),
    ),
    # Lumina2: 8x VAE, latents (4, 4, 4); a short system prompt so that the prompt fits.
    "lumina2": (
        build_lumina2,
        Lumina2Pipeline,
        {"max_sequence_length": 24, "system_prompt": "Draw the prompt."},
        (1, 4, 4, 4),
    ),
    # QwenImage latents come back packed: (batch, (32/8/2)**2 patches, 4 channels * 2 * 2).
    "qwenimage": (build_qwenimage, QwenImagePipeline, {}, (1, 4, 16)),
    # Chroma: FLUX's packed latents, T5 context cut to 16 tokens.
    "chroma": (build_chroma, ChromaPipeline, {"max_sequence_length": 16}, (1, 16, 16)),
    # Z-Image: 4x VAE, latents (4, 8, 8), padded Qwen3 context cut to 64 tokens.
    "zimage": (build_zimage, ZImagePipeline, {"max_sequence_length": 64}, (1, 4, 8, 8)),
}


def _digests(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize(
    ("load", "first", "last"),
    [(clip_tokenizer, "bos", "eos"), (t5_tokenizer, None, "eos"), (gemma_tokenizer, "bos", None)],
    ids=["clip", "t5", "gemma"],
)
def test_tokenizer_round_trips(
    load: Callable[[], Any], first: str | None, last: str | None
) -> None:
    tokenizer = load()
    ids = tokenizer(PROMPT).input_ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == PROMPT
    # Without specials: CLIP's unk token is its eos token.
    assert tokenizer.unk_token_id not in tokenizer(PROMPT, add_special_tokens=False).input_ids
    # Whole words are single tokens, so sequences stay short as with the real vocabularies.
    assert len(ids) <= len(PROMPT.split()) + 2
    if first is not None:
        assert ids[0] == getattr(tokenizer, f"{first}_token_id")
    if last is not None:
        assert ids[-1] == getattr(tokenizer, f"{last}_token_id")
    padded = tokenizer(PROMPT, padding="max_length", max_length=12, truncation=True).input_ids
    assert len(padded) == 12


def test_t5_and_gemma_special_ids_match_the_real_models() -> None:
    """T5EncoderModel/Gemma2Model configs hard-code these ids (pad 0; T5 eos 1, Gemma bos 2)."""
    t5, gemma = t5_tokenizer(), gemma_tokenizer()
    assert (t5.pad_token_id, t5.eos_token_id, t5.unk_token_id) == (0, 1, 2)
    ids = (gemma.pad_token_id, gemma.eos_token_id, gemma.bos_token_id, gemma.unk_token_id)
    assert ids == (0, 1, 2, 3)
    # Characters outside the vocabulary fall back to <0xNN> byte tokens, as in Gemma.
    assert gemma.decode(gemma("café").input_ids, skip_special_tokens=True) == "café"


def test_make_tokenizers_reproduces_the_committed_files(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "make_tokenizers", FIXTURES / "make_tokenizers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, write in [
        ("clip_tokenizer", module.write_clip),
        ("t5_tokenizer", module.write_t5),
        ("gemma_tokenizer", module.write_gemma),
        ("qwen2_tokenizer", module.write_qwen2),
    ]:
        write(tmp_path / name)
        assert _digests(tmp_path / name) == _digests(FIXTURES / name), name


def test_qwen2_tokenizer_splits_the_qwenimage_template_like_the_real_one(tmp_path: Path) -> None:
    """QwenImagePipeline drops the first 34 tokens of its chat template (the system turn and
    the user turn's header: 34 tokens with Qwen2.5-VL's tokenizer); the tiny tokenizer splits
    that prefix into whole-word tokens, 34 of them, so what remains is the prompt's."""
    pipe = QwenImagePipeline.from_pretrained(build_qwenimage(tmp_path / "qwen"))
    template, drop = pipe.prompt_template_encode, pipe.prompt_template_encode_start_idx
    assert drop == 34
    tokenizer = qwen2_tokenizer()
    assert len(tokenizer(template.split("{}")[0]).input_ids) == drop
    ids = tokenizer(template.format(PROMPT)).input_ids
    # The prompt, then the template's tail (kept by the pipeline, as with the real tokenizer).
    assert tokenizer.decode(ids[drop:], skip_special_tokens=True) == PROMPT + "\nassistant\n"
    assert tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")


@pytest.mark.parametrize("family", FAMILIES)
def test_pipeline_builds_reloads_and_generates(family: str, tmp_path: Path) -> None:
    build, pipeline_class, kwargs, latent_shape = FAMILIES[family]
    directory = build(tmp_path / family)
    size = sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())
    assert size < 3_000_000
    pipe = pipeline_class.from_pretrained(directory)
    pipe.set_progress_bar_config(disable=True)

    def generate(output_type: str, height: int = 32) -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        return pipe(
            prompt="a red cat",
            num_inference_steps=2,
            height=height,
            width=height,
            output_type=output_type,
            generator=generator,
            **kwargs,
        ).images

    image = generate("pt")
    assert image.shape == (1, 3, 32, 32)
    assert torch.isfinite(image).all()
    assert generate("pt").equal(image)  # seeded: reproducible
    assert generate("latent").shape == latent_shape
    assert generate("pt", height=64).shape == (1, 3, 64, 64)


@pytest.mark.parametrize("family", FAMILIES)
def test_builds_are_deterministic(family: str, tmp_path: Path) -> None:
    build = FAMILIES[family][0]
    assert _digests(build(tmp_path / "a")) == _digests(build(tmp_path / "b"))


def test_sana_defaults_work_without_resolution_binning(tmp_path: Path) -> None:
    """SANA's default 300-token prompt with its long complex_human_instruction prefix runs; only
    resolution binning must be switched off (the tiny sample_size is not a binning size)."""
    pipe = SanaPipeline.from_pretrained(build_sana(tmp_path / "sana"))
    pipe.set_progress_bar_config(disable=True)
    embeds, mask, _, _ = pipe.encode_prompt("a red cat", do_classifier_free_guidance=False)
    assert embeds.shape == (1, 300, 32)
    assert mask.shape == (1, 300)
    call = {"prompt": "a red cat", "num_inference_steps": 2, "height": 32, "width": 32}
    image = pipe(**call, output_type="pt", use_resolution_binning=False).images
    assert image.shape == (1, 3, 32, 32)
    assert torch.isfinite(image).all()
    with pytest.raises(ValueError, match="Invalid sample size"):
        pipe(**call, output_type="pt")
