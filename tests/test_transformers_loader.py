"""The one loader of transformers checkpoints (``loading/transformers_checkpoint.py``) on tiny
random checkpoints saved to disk: it gives what the stock Auto classes give, pads on the left,
the policy adapters and the judge back-end get the same model from the same directory, and a
checkpoint that cannot load is one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from test_causal_lm import save_tiny_lm
from test_masked_lm import save_tiny_dllm
from vision_tiny import build_llava

from loading.transformers_checkpoint import (
    CheckpointHints,
    is_vision_language,
    load_causal_lm,
    load_masked_lm,
    load_vision_language_model,
)
from pipelines import build_policy
from reward_models.judge_backend import JudgeBackend

HINTS = CheckpointHints(local_dir="--set x.pretrained=DIR", trust_remote_code="x.remote=true")


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llava(tmp_path_factory.mktemp("llava"))


def test_a_causal_lm_loads_as_the_stock_class_does(lm: Path) -> None:
    from transformers import AutoModelForCausalLM

    model, tokenizer = load_causal_lm(str(lm), "float32", False, HINTS)
    assert tokenizer.padding_side == "left"
    assert not is_vision_language(str(lm), False, HINTS)
    stock = AutoModelForCausalLM.from_pretrained(str(lm))
    assert type(model) is type(stock) and model.dtype == torch.float32
    ids = tokenizer(["say a", "write 12"], return_tensors="pt", padding=True)
    with torch.no_grad():
        torch.testing.assert_close(model(**ids).logits, stock(**ids).logits, rtol=0, atol=0)
    assert ids["attention_mask"][0, 0] == 0  # the shorter prompt is padded on the left
    bf16, _ = load_causal_lm(str(lm), "bfloat16", False, HINTS)
    assert bf16.dtype == torch.bfloat16


def test_a_vision_language_model_loads_as_the_stock_class_does(vlm: Path) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model, processor = load_vision_language_model(str(vlm), "float32", False, HINTS)
    assert processor.tokenizer.padding_side == "left"
    assert is_vision_language(str(vlm), False, HINTS)
    stock = AutoModelForImageTextToText.from_pretrained(str(vlm))
    assert type(model) is type(stock) and type(processor) is type(
        AutoProcessor.from_pretrained(str(vlm))
    )
    message = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Does"}]}
    text = processor.apply_chat_template([message], add_generation_prompt=True)
    image = Image.new("RGB", (40, 40), (200, 30, 30))
    inputs = processor(images=[image], text=[text], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, stock(**inputs).logits, rtol=0, atol=0)


def test_a_masked_lm_loads_as_the_stock_class_does(tmp_path: Path) -> None:
    from transformers import AutoModelForMaskedLM

    directory = save_tiny_dllm(tmp_path / "dllm")
    model, tokenizer = load_masked_lm(str(directory), "float32", False, HINTS)
    assert tokenizer.padding_side == "left"
    stock = AutoModelForMaskedLM.from_pretrained(str(directory))
    assert type(model) is type(stock)
    ids = torch.tensor([[3, 4, 1, 5]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, stock(input_ids=ids).logits)


@pytest.mark.parametrize(("fixture", "adapter"), [("lm", "causal_lm"), ("vlm", "vlm")])
def test_the_judge_and_the_policy_load_the_same_model(
    fixture: str, adapter: str, request: pytest.FixtureRequest
) -> None:
    directory = str(request.getfixturevalue(fixture))
    # The character-level LM has single tokens for letters, not for "yes" and "no".
    words = {"yes_words": ["a"], "no_words": ["b"]} if fixture == "lm" else {}
    judge = JudgeBackend(model=directory, dtype="bfloat16", **words)
    judged, processor, vision, _, _ = judge._load()
    policy = build_policy(adapter, pretrained=directory, dtype="bfloat16")
    assert vision == (adapter == "vlm")
    assert type(judged) is type(policy.network)
    assert judged.dtype == policy.network.dtype == torch.bfloat16
    ours, theirs = judged.state_dict(), policy.network.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    tokenizer = processor.tokenizer if vision else processor
    assert tokenizer.padding_side == policy.tokenizer.padding_side == "left"


def test_a_checkpoint_that_cannot_load_is_one_line(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    with pytest.raises(ValueError, match="cannot load") as caught:
        load_causal_lm(missing, "float32", False, HINTS)
    message = str(caught.value)
    assert message.startswith(f"cannot load {missing!r} as a causal LM: ") and "\n" not in message
    assert "x.remote=true" not in message  # a missing directory is not a custom-code problem
    with pytest.raises(ValueError, match=r"cannot load .* as a VLM: .*\S$"):
        load_vision_language_model(missing, "float32", False, HINTS)
    with pytest.raises(ValueError, match=r"dtype must be one of \['bfloat16', 'float16', "):
        load_causal_lm(missing, "float64", False, HINTS)
    # An architecture transformers does not know: custom code is the likely cause.
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "made_up_model"}))
    hinted = r"as a judge: .*\(custom model code needs x\.remote=true\)$"
    with pytest.raises(ValueError, match=hinted):
        is_vision_language(str(unknown), False, HINTS, "judge")
    with pytest.raises(ValueError) as caught:
        load_causal_lm(str(unknown), "float32", True, HINTS)  # already trusted: no hint
    assert "custom model code" not in str(caught.value) and "\n" not in str(caught.value)
    # The policy's and the judge's errors say how their own settings are spelled.
    with pytest.raises(ValueError, match=r"policy\.kwargs\.trust_remote_code=true\)$"):
        build_policy("causal_lm", pretrained=str(unknown))
    with pytest.raises(ValueError, match=r"^artifact_judge: cannot load .* as a judge: .*judge's"):
        JudgeBackend(model=str(unknown), owner="artifact_judge")._load()
    with pytest.raises(ValueError, match="dtype must be one of"):
        JudgeBackend(model=missing, dtype="float64")
