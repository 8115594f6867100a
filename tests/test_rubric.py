"""Rubric rewards against hand-computed numbers: routing, minimal exposure, aggregation with the
essential gate, saturation, POW3R weights; judges on the tiny LLaVA and a loopback endpoint."""

from __future__ import annotations

import io
import json
import math
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from test_artifact_judge import FakeEndpoint, llava  # noqa: F401 (llava: the shared fixture)

from reward_models import build_reward
from reward_models.rubric.aggregate import aggregate

ANSWER = {"id": "answer", "text": "The final answer is right", "weight": 4, "category": "essential",
          "route": "extract", "extractor": "boxed", "verifier": "numeric"}  # fmt: skip
SHORT = {"id": "short", "text": "At most six words", "weight": 2, "category": "important",
         "route": "verifier", "verifier": "word_count", "verifier_kwargs": {"max_words": 6}}  # fmt: skip
UNITS = {"id": "units", "text": "Gives units", "weight": 1, "category": "optional",
         "route": "verifier", "verifier": "reward_models.rubric.spec:verify_contains",
         "answer": "apples"}  # fmt: skip
SORRY = {"id": "sorry", "text": "Apologises", "weight": 2, "category": "pitfall",
         "route": "verifier", "verifier": "regex", "verifier_kwargs": {"pattern": "(?i)sorry"}}  # fmt: skip
RUBRIC = [ANSWER, SHORT, UNITS, SORRY]
TEXTS = [
    "\\boxed{42} apples",  # E=1, A=(2+1)/3=1, P=0 -> r=1
    "Sorry, it is \\boxed{41} apples",  # E=0 (fails the gate), A=1, P=2/7 -> r=0-2/7
    "so after long thought the total is \\boxed{42}",  # E=1, A=0 -> r=1/2
    "no box here",  # E=0, A=(2*1+0)/3 -> r=0
]


def test_routes_gate_and_pitfalls_by_hand() -> None:
    reward = build_reward("rubric", rubric=RUBRIC, saturation="keep")
    out = reward(TEXTS, [f"p{i}" for i in range(4)], [{"answer": 42}] * 4)
    s = out.scores
    assert s["criterion/answer"].tolist() == [1, 0, 1, 0]
    assert s["criterion/short"].tolist() == [1, 1, 0, 1]
    assert s["criterion/units"].tolist() == [1, 1, 0, 0]
    assert s["criterion/sorry"].tolist() == [0, 1, 0, 0]
    assert s["gate_pass"].tolist() == [1, 0, 1, 0]
    assert s["rubric"].tolist() == pytest.approx([1.0, -2 / 7, 0.5, 0.0])
    assert out.info is not None and out.info[0]["extracted"]["answer"] == "42"
    hard = build_reward("rubric", rubric=RUBRIC, gate="hard", saturation="keep")
    # hard: gate_pass * F - P, F over essential+important+optional (weights 4, 2, 1).
    assert hard(TEXTS, ["a", "b", "c", "d"], [{"answer": 42}] * 4).scores["rubric"].tolist() == (
        pytest.approx([1.0, -2 / 7, 4 / 7, 0.0])
    )
    flat = build_reward("rubric", rubric=RUBRIC, gate="none", saturation="keep")
    assert flat(TEXTS, ["a", "b", "c", "d"], [{"answer": 42}] * 4).scores["rubric"].tolist() == (
        pytest.approx([1.0, 3 / 7 - 2 / 7, 4 / 7, 2 / 7])
    )


def test_aggregate_only_pitfalls_and_nothing_active() -> None:
    scores = torch.tensor([[1.0, 0.0], [float("nan"), float("nan")]])
    out = aggregate(scores, torch.tensor([[1.0, 3.0]] * 2), torch.full((2, 2), 3),
                    torch.ones(2, 2, dtype=torch.bool))  # fmt: skip
    assert out["reward"][0] == pytest.approx(-0.25) and math.isnan(out["reward"][1])


def test_saturated_criteria_leave_the_group_mean() -> None:
    reward = build_reward("rubric", rubric=RUBRIC)
    # One group of two: "short" and "sorry" are the same for both, so only "units" stays in A.
    texts = ["\\boxed{42} apples", "\\boxed{41} pears"]
    out = reward(texts, ["p", "p"], [{"answer": 42}] * 2)
    assert out.scores["saturated_fraction"].tolist() == [0.5, 0.5]
    # r0 = (1 + 1 * 1) / 2; r1: gate fails -> E / 2 = 0. "answer" (essential) is never dropped.
    assert out.scores["rubric"].tolist() == pytest.approx([1.0, 0.0])
    assert out.scores["additional"].tolist() == [1.0, 0.0]  # units only
    single = reward(texts, ["p", "q"], [{"answer": 42}] * 2)  # two groups of one: nothing drops
    assert single.scores["saturated_fraction"].tolist() == [0.0, 0.0]


def test_rubric_sources_column_mapping_json_and_yaml(tmp_path: Path) -> None:
    one = [{"text": "mentions cats", "route": "verifier", "verifier": "contains", "answer": "cat"}]
    two = [{"text": "exact", "route": "verifier", "verifier": "exact"}]
    (tmp_path / "r.json").write_text(json.dumps({"criteria": one}))
    (tmp_path / "r.yaml").write_text("- text: exact\n  route: verifier\n  verifier: exact\n")
    (tmp_path / "map.json").write_text(json.dumps({"q": two}))
    from_file = build_reward("rubric", rubric=str(tmp_path / "r.json"))
    assert from_file(["a cat"], ["x"]).scores["rubric"].tolist() == [1.0]
    by_prompt = build_reward(
        "rubric", rubrics=str(tmp_path / "map.json"), rubric=str(tmp_path / "r.yaml")
    )
    meta = [{"answer": "Yes."}, {"answer": "b"}, {"rubric": json.dumps(one)}]
    out = by_prompt(["yes", "b", "cat!"], ["q", "other", "q"], meta)
    assert out.scores["rubric"].tolist() == [1.0, 1.0, 1.0]
    assert set(out.scores) >= {"criterion/c0"}
    with pytest.raises(ValueError, match="no rubric"):
        build_reward("rubric")(["x"], ["p"])
    with pytest.raises(ValueError, match="category"):
        build_reward("rubric", rubric=[{"text": "x", "category": "vital"}])


def test_not_applicable_criteria_are_nan_and_skipped() -> None:
    rubric = [{"id": "n", "text": "number", "route": "verifier", "verifier": "numeric"}, SHORT]
    out = build_reward("rubric", rubric=rubric)(["2 then 1", "3"], ["a", "b"], [{"answer": 1}, {}])
    # Sample 1 has no ground truth: the numeric criterion does not apply there.
    assert out.scores["criterion/n"][0] == 1 and out.applicable["criterion/n"].tolist() == [
        True,
        False,
    ]
    assert out.scores["rubric"].tolist() == [1.0, 1.0]


class Recorder:
    """A judge back-end that records what it is shown."""

    def __init__(self) -> None:
        self.generated: list[tuple[list[str], list[Any]]] = []
        self.judged: list[tuple[list[str], list[Any]]] = []

    def generate(self, questions: list[str], images: list[Any]) -> list[str]:
        self.generated.append((questions, images))
        return ["42" if "boxed" not in q else "NONE" for q in questions]

    def p_yes(self, questions: list[str], images: list[Any]) -> torch.Tensor:
        self.judged.append((questions, images))
        return torch.tensor([0.25 if i is None else 0.75 for i in images])


def test_minimal_exposure_of_extractor_and_judge() -> None:
    rubric = [
        {"id": "ans", "text": "correct", "category": "essential", "route": "extract",
         "extract": "the number of apples", "verifier": "exact", "answer": "1337"},
        {"id": "tone", "text": "polite", "route": "judge"},
        {"id": "look", "text": "describes the photo", "route": "judge", "needs_image": True},
    ]  # fmt: skip
    recorder = Recorder()
    reward = build_reward("rubric", rubric=rubric, judge=recorder, saturation="keep")
    image = torch.rand(3, 8, 8)
    out = reward(["I count 42", "boxed"], ["how many?", "how many?"], [{"image": image}] * 2)
    assert len(recorder.generated) == 1 and len(recorder.judged) == 1  # batched: one call each
    questions, _ = recorder.generated[0]
    assert len(questions) == 2 and all("1337" not in q for q in questions)
    assert "the number of apples" in questions[0] and "I count 42" in questions[0]
    judged, images = recorder.judged[0]
    assert [i is None for i in images] == [True, False, True, False]  # only "look" sees it
    assert torch.equal(images[1], image) and all("1337" not in q for q in judged)
    assert out.scores["criterion/tone"].tolist() == [0.25, 0.25]
    assert out.scores["criterion/look"].tolist() == [0.75, 0.75]
    assert out.scores["criterion/ans"].tolist() == [0.0, 0.0]  # "42" != "1337"; NONE -> 0
    leaky = [{"text": "x", "route": "extract", "extract": "the 1337", "verifier": "exact"}]
    with pytest.raises(ValueError, match="ground truth"):
        build_reward("rubric", rubric=leaky, judge=recorder)(["a"], ["p"], [{"answer": "1337"}])
    one_by_one = Recorder()
    build_reward("rubric", rubric=rubric, judge=one_by_one, batched=False)(
        ["a", "b"], ["p", "p"], [{"image": image}] * 2
    )
    assert len(one_by_one.generated) == 2 and len(one_by_one.judged) == 4


def test_local_vlm_judge_by_hand_and_batched_equals_one_by_one(llava: Path) -> None:  # noqa: F811
    from transformers import AutoModelForImageTextToText, AutoProcessor

    rubric = [{"id": "a", "text": "Yes", "route": "judge"},
              {"id": "b", "text": "Does this image contain artifacts? Answer", "route": "judge",
               "needs_image": True}]  # fmt: skip
    judge = {"model": str(llava), "batch_size": 8}
    reward = build_reward("rubric", rubric=rubric, judge=judge, saturation="keep")
    image = torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0))
    meta = [{"image": image}] * 3
    texts, prompts = ["Yes", "No No No", "or"], ["Does", "this", "image"]
    out = reward(texts, prompts, meta)
    assert reward.judge.calls == 2  # one forward for the text items, one for the image items
    # By hand, sample 1's text criterion: the chat template around the judge question.
    processor = AutoProcessor.from_pretrained(str(llava))
    model = AutoModelForImageTextToText.from_pretrained(str(llava)).eval()
    question = reward.judge_template.format(prompt="this", response="No No No", criterion="Yes")
    chat = [{"role": "user", "content": [{"type": "text", "text": question}]}]
    inputs = processor(text=[processor.apply_chat_template(chat, add_generation_prompt=True)],
                       return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        probs = model(**inputs).logits[0, -1].softmax(-1)
    vocab = processor.tokenizer.get_vocab()
    p_yes = probs[vocab["Yes"]] + probs[vocab["yes"]]
    p_no = probs[vocab["No"]] + probs[vocab["no"]]
    assert float(out.scores["criterion/a"][1]) == pytest.approx(
        float(p_yes / (p_yes + p_no)), abs=1e-5
    )
    single = build_reward("rubric", rubric=rubric, judge=judge, batched=False, saturation="keep")
    alone = single(texts, prompts, meta)
    assert single.judge.calls == 6
    for key in ("criterion/a", "criterion/b", "rubric"):
        torch.testing.assert_close(alone.scores[key], out.scores[key], atol=1e-5, rtol=0)


class FakeChat(FakeEndpoint):
    """The shared fake endpoint, plus a message ("42") for requests of more than one token."""

    texts: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = json.loads(raw)
        if body.get("max_tokens", 1) == 1:
            self.rfile = io.BytesIO(raw)
            return super().do_POST()
        FakeChat.texts.append(body)
        data = json.dumps({"choices": [{"message": {"content": " 42 "}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return None


def test_endpoint_judge_and_extractor_over_a_loopback_socket() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeChat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    rubric = [
        {"id": "ans", "text": "right", "category": "essential", "route": "extract",
         "verifier": "numeric"},
        {"id": "tone", "text": "polite", "route": "judge"},
        {"id": "look", "text": "matches the picture", "route": "judge", "needs_image": True},
    ]  # fmt: skip
    seen = len(FakeEndpoint.requests)
    try:
        reward = build_reward("rubric", rubric=rubric, judge={"endpoint": url, "endpoint_model": "j"},
                              saturation="keep")  # fmt: skip
        out = reward(["x", "y"], ["p", "q"], [{"answer": "42.0", "image": torch.rand(3, 8, 8)}] * 2)
    finally:
        server.shutdown()
    assert reward.judge.calls == 6  # two extractions, four judge questions
    assert out.scores["criterion/ans"].tolist() == [1.0, 1.0]
    # P(yes) = 0.3 / 0.8 (the shared fake's log-probs); r = (1 + 1 * 0.375) / 2.
    assert out.scores["criterion/tone"].tolist() == pytest.approx([0.375] * 2)
    assert out.scores["rubric"].tolist() == pytest.approx([0.6875] * 2)
    judged = FakeEndpoint.requests[seen:]
    del FakeEndpoint.requests[seen:]  # leave the shared log as we found it
    with_image = [
        any(c["type"] == "image_url" for c in r["messages"][0]["content"]) for r in judged
    ]
    assert sorted(with_image) == [False, False, True, True]
    assert all("42" not in json.dumps(r) for r in FakeChat.texts)  # the extractor never sees it


def test_pow3r_one_update_by_hand_and_checkpoint() -> None:
    rubric = [
        {"id": "e", "text": "essential", "category": "essential", "route": "verifier",
         "verifier": "contains", "answer": "e"},
        {"id": "a", "text": "a", "weight": 2, "route": "verifier", "verifier": "contains", "answer": "a"},
        {"id": "b", "text": "b", "weight": 1, "route": "verifier", "verifier": "contains", "answer": "b"},
    ]  # fmt: skip
    reward = build_reward("rubric_pow3r", rubric=rubric, ema=0.5, saturation="keep")
    texts, prompts = ["e a b", "e a"], ["p", "p"]
    first = reward(texts, prompts)
    # Never seen: every contrast is the prior 0.5, so the adapted weights are the human ones.
    torch.testing.assert_close(first.scores["rubric_pow3r"], first.scores["human"])
    metrics = reward.update(texts, prompts)
    # Contrast: e and a score (1, 1) -> std 0; b scores (1, 0) -> std 0.5.
    assert metrics["criteria_updated"] == 3 and metrics["contrast_mean"] == pytest.approx(0.5 / 3)
    crits = reward.default
    assert [reward.criterion_contrast(c) for c in crits] == [0.0, 0.0, 0.5]
    # important: H = 3; a = 3 * 2 * 0.05 / (2 * 0.05 + 1 * 0.55), b = 3 * 0.55 / 0.65.
    assert reward.weights_for(crits) == pytest.approx([1.0, 0.3 / 0.65, 1.65 / 0.65])
    out = reward(texts, prompts)
    # sample 1: A = (0.4615 * 1 + 2.5385 * 0) / 3 -> r = (1 + A) / 2; human: A = 2 / 3.
    assert float(out.scores["rubric_pow3r"][1]) == pytest.approx((1 + 0.3 / 0.65 / 3) / 2)
    assert float(out.scores["human"][1]) == pytest.approx((1 + 2 / 3) / 2)
    reward.update(["e a b", "e a b"], prompts)  # b now (1, 1): 0.5 * 0.5 + 0.5 * 0
    assert reward.criterion_contrast(crits[2]) == pytest.approx(0.25)
    fresh = build_reward("rubric_pow3r", rubric=rubric)
    fresh.load_state_dict(reward.state_dict())
    assert fresh.weights_for(crits) == pytest.approx(reward.weights_for(crits))
    assert fresh.steps == 2
    # With two processes, gather concatenates the tables: the same group counted twice.
    twice = build_reward("rubric_pow3r", rubric=rubric)
    twice.update(texts, prompts, gather=lambda t: torch.cat([t, t]))
    assert twice.criterion_contrast(crits[2]) == pytest.approx(0.5)


def test_local_llm_extractor_batched_equals_one_by_one(llava: Path) -> None:  # noqa: F811
    rubric = [{"id": "x", "text": "t", "route": "extract", "verifier": "exact", "answer": "Yes"}]
    judge = {"model": str(llava), "max_new_tokens": 3}
    texts, prompts = ["Yes", "No or this image", "no"], ["Does", "this", "image"]
    batched = build_reward("rubric", rubric=rubric, judge=judge)
    alone = build_reward("rubric", rubric=rubric, judge=judge, batched=False)
    out, single = batched(texts, prompts), alone(texts, prompts)
    assert batched.judge.calls == 1 and alone.judge.calls == 3
    assert out.info is not None and single.info is not None
    got = [i["extracted"]["x"] for i in out.info]
    assert got == [i["extracted"]["x"] for i in single.info]
    assert all(g is None or isinstance(g, str) for g in got)
