"""The VLM-judge artifact reward: a tiny LLaVA saved and loaded back, and a fake
OpenAI-compatible endpoint over a loopback socket."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from vision_tiny import build_llava

from reward_models import RewardError, build_reward


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llava(tmp_path_factory.mktemp("llava"))


def pictures(n: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, 40, 40, generator=torch.Generator().manual_seed(seed))


def test_local_judge_reads_yes_and_no_from_the_last_logits(llava: Path) -> None:
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    judge = build_reward("artifact_judge", model=str(llava), batch_size=2)
    images = pictures(3)
    out = judge(images, ["p"] * 3)
    scores = out.scores["artifact_judge"]
    assert scores.shape == (3,) and ((scores > 0) & (scores < 1)).all()
    torch.testing.assert_close(scores, 1 - out.scores["p_yes"])
    # By hand for the first image: softmax of the last position over Yes/yes vs No/no.
    processor = AutoProcessor.from_pretrained(str(llava))
    model = AutoModelForImageTextToText.from_pretrained(str(llava)).eval()
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": judge.question}]}
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    array = (images[0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    inputs = processor(images=[Image.fromarray(array)], text=[text], return_tensors="pt")
    with torch.no_grad():
        probs = model(**inputs).logits[0, -1].softmax(-1)
    vocab = processor.tokenizer.get_vocab()
    p_yes = probs[vocab["Yes"]] + probs[vocab["yes"]]
    p_no = probs[vocab["No"]] + probs[vocab["no"]]
    assert float(out.scores["p_yes"][0]) == pytest.approx(float(p_yes / (p_yes + p_no)), abs=1e-5)
    # One image per call gives the same scores (batching pads nothing: one prompt text).
    single = torch.cat([judge(images[i : i + 1], ["p"]).scores["artifact_judge"] for i in range(3)])
    torch.testing.assert_close(single, scores, atol=1e-5, rtol=0)


def test_judge_needs_exactly_one_backend() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        build_reward("artifact_judge")
    with pytest.raises(ValueError, match="exactly one"):
        build_reward("artifact_judge", model="m", endpoint="http://x")


class FakeEndpoint(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint whose answer token is 'Yes' with p = 0.2 (' yes' 0.1)
    and 'No' with 0.5; or, for the model name "broken", a reply without logprobs."""

    requests: ClassVar[list[dict]] = []

    def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
        del args

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeEndpoint.requests.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), **body}
        )
        top = [
            {"token": "Yes", "logprob": math.log(0.2)},
            {"token": " yes", "logprob": math.log(0.1)},
            {"token": "No", "logprob": math.log(0.5)},
            {"token": "Maybe", "logprob": math.log(0.2)},
        ]
        choice = {"logprobs": {"content": [{"token": "No", "top_logprobs": top}]}}
        reply = {"choices": [{}] if body["model"] == "broken" else [choice]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_endpoint_judge_over_a_loopback_socket(monkeypatch) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("JUDGE_KEY", "k3y")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        judge = build_reward(
            "artifact_judge", endpoint=url, endpoint_model="judge", api_key_env="JUDGE_KEY"
        )
        out = judge(pictures(2), ["p", "p"])
        broken = build_reward("artifact_judge", endpoint=url, endpoint_model="broken", retries=0)
        with pytest.raises(RewardError, match="no top_logprobs"):
            broken(pictures(1), ["p"])
    finally:
        server.shutdown()
    # P(yes) = (0.2 + 0.1) / (0.2 + 0.1 + 0.5); "Maybe" is neither answer.
    assert out.scores["artifact_judge"].tolist() == pytest.approx([1 - 0.3 / 0.8] * 2)
    request = FakeEndpoint.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer k3y"
    assert request["max_tokens"] == 1 and request["logprobs"] is True
    image = request["messages"][0]["content"][0]["image_url"]["url"]
    assert image.startswith("data:image/png;base64,")
