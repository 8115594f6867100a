"""VQAScore through a tiny local LLaVA and a loopback OpenAI-compatible endpoint."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from test_artifact_judge import FakeEndpoint, pictures
from vision_tiny import build_llava, build_qwen2_vl

from reward_models import build_reward


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llava(tmp_path_factory.mktemp("llava"))


def test_local_vqa_score_is_p_yes_over_the_vocabulary_for_each_prompt(llava: Path) -> None:
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    judge = build_reward("vqa_score", model=str(llava), batch_size=2)
    images, prompts = pictures(3), ["a red cat", "Yes or No", "a red cat"]
    scores = judge(images, prompts).scores["vqa_score"]
    processor = AutoProcessor.from_pretrained(str(llava))
    model = AutoModelForImageTextToText.from_pretrained(str(llava)).eval()
    vocab = processor.tokenizer.get_vocab()
    expected, normalised = [], []
    for image, prompt in zip(images, prompts, strict=True):
        question = f'Does this figure show "{prompt}"? Please answer Yes or No.'
        messages = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}
        ]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        array = (image.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        inputs = processor(images=[Image.fromarray(array)], text=[text], return_tensors="pt")
        with torch.no_grad():
            probs = model(**inputs).logits[0, -1].softmax(-1)
        p_yes = float(probs[vocab["Yes"]] + probs[vocab["yes"]])
        p_no = float(probs[vocab["No"]] + probs[vocab["no"]])
        expected.append(p_yes)
        normalised.append(p_yes / (p_yes + p_no))
    assert scores.tolist() == pytest.approx(expected, abs=1e-5)
    both = build_reward("vqa_score", model=str(llava), normalize=True)(images, prompts)
    assert both.scores["vqa_score"].tolist() == pytest.approx(normalised, abs=1e-5)


def test_batched_qwen2_vl_judge_reads_what_each_question_reads_alone(tmp_path: Path) -> None:
    """Left padding in a batch of questions of different lengths must not move the answer of
    a judge with multimodal RoPE (Qwen2-VL), whose positions the model computes itself."""
    qwen = build_qwen2_vl(tmp_path / "qwen2_vl")
    # The tiny tokenizer is character-level: "y" / "n" are its single-token answers.
    words = {"yes_words": ["y"], "no_words": ["n"], "normalize": True}
    images, prompts = pictures(3), ["a cat", "two red squares on a table", "x"]
    batched = build_reward("vqa_score", model=str(qwen), batch_size=3, **words)
    alone = build_reward("vqa_score", model=str(qwen), batch_size=1, **words)
    together = batched(images, prompts).scores["vqa_score"]
    assert torch.isfinite(together).all()
    expected = alone(images, prompts).scores["vqa_score"].tolist()
    assert together.tolist() == pytest.approx(expected, abs=1e-5)


def test_endpoint_vqa_score_asks_about_each_prompt() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    FakeEndpoint.requests.clear()
    try:
        out = build_reward("vqa_score", endpoint=url, endpoint_model="judge")(
            pictures(2), ["a cat", "a dog"]
        )
    finally:
        server.shutdown()
    # The fake's answer token: "Yes" 0.2 and " yes" 0.1 of the whole vocabulary.
    assert out.scores["vqa_score"].tolist() == pytest.approx([0.3, 0.3])
    asked = sorted(r["messages"][0]["content"][1]["text"] for r in FakeEndpoint.requests)
    assert asked == [
        'Does this figure show "a cat"? Please answer Yes or No.',
        'Does this figure show "a dog"? Please answer Yes or No.',
    ]
    FakeEndpoint.requests.clear()
    with pytest.raises(ValueError, match="must contain"):
        build_reward("vqa_score", endpoint=url, question="Is it good?")
