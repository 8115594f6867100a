"""``genrl serve-rollout``'s HTTP front and ``generation.engine=vllm_server``'s client, on a
stand-in engine (transformers' sampling on the embedded Countdown LM; vLLM's own back-end is
tested in the engine lane, ``tests/test_vllm_engine.py``): request checks and their 4xx bodies,
the token, the weight pushes, and two GRPO iterations through the server."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save
from starlette.testclient import TestClient

from genrl import get_recipe
from genrl.config.errors import ConfigError
from genrl.loop.trainer import Trainer
from genrl.rollouts.engines.rollout_server import (
    RequestError,
    RolloutServer,
    ServerLimits,
    parse_generate,
)
from genrl.rollouts.engines.vllm_requests import EngineRequest
from genrl.rollouts.engines.vllm_server import RolloutServerError, VLLMServerEngine
from loading.assets import embedded_asset_path

CHECKPOINT = embedded_asset_path("countdown_lm/model.safetensors").parent
MODEL = {"checkpoint": "x", "vocab_size": 20, "max_model_len": 16}
SETTINGS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_tokens": 4}


class TransformersBackend:
    """An engine stand-in: transformers' sampling, per request seeded with its seed, log-probs
    of the processed (temperature-scaled) distribution, as vLLM's ``processed_logprobs``."""

    def __init__(self, checkpoint: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
        self.loads = 0

    def describe(self) -> dict[str, Any]:
        config = self.model.config
        return {
            "checkpoint": "countdown_lm",
            "vocab_size": config.vocab_size,
            "max_model_len": config.max_position_embeddings,
        }

    @torch.no_grad()
    def generate(self, requests: list[EngineRequest], settings: dict[str, Any]) -> list[Any]:
        groups = []
        for r in requests:
            torch.manual_seed(r.seed)
            ids = torch.tensor([r.token_ids])
            out = self.model.generate(
                ids.repeat(r.n, 1),
                attention_mask=torch.ones(r.n, len(r.token_ids), dtype=torch.long),
                do_sample=True,
                temperature=settings["temperature"],
                top_k=0,
                max_new_tokens=settings["max_tokens"],
                eos_token_id=settings["stop_token_ids"],
                pad_token_id=settings["stop_token_ids"][0],
                output_scores=True,
                return_dict_in_generate=True,
            )
            new = out.sequences[:, len(r.token_ids) :]
            samples = []
            for row in range(r.n):
                tokens, logprobs, reason = [], [], "length"
                for step, token in enumerate(new[row].tolist()):
                    scores = out.scores[step][row].log_softmax(-1)
                    tokens.append(token)
                    logprobs.append(float(scores[token]))
                    if token in settings["stop_token_ids"]:
                        reason = "stop"
                        break
                samples.append({"token_ids": tokens, "logprobs": logprobs, "finish_reason": reason})
            groups.append(samples)
        return groups

    def load_weights(self, weights: Any) -> None:
        self.model.load_state_dict(dict(weights), strict=True)
        self.loads += 1


class CountingBackend:
    """The HTTP tests' engine: sample ``j`` of a request is ``[seed + j]`` with log-prob -1."""

    def __init__(self) -> None:
        self.loads: list[list[str]] = []

    def describe(self) -> dict[str, Any]:
        return dict(MODEL)

    def generate(self, requests: list[EngineRequest], settings: dict[str, Any]) -> list[Any]:
        del settings
        return [
            [
                {"token_ids": [(r.seed + j) % 20], "logprobs": [-1.0], "finish_reason": "stop"}
                for j in range(r.n)
            ]
            for r in requests
        ]

    def load_weights(self, weights: Any) -> None:
        self.loads.append([name for name, _ in weights])


@pytest.fixture
def backend() -> CountingBackend:
    return CountingBackend()


def _client(backend: Any, token: str = "", **limits: Any) -> TestClient:
    server = RolloutServer(backend, token, ServerLimits(**limits))
    return TestClient(server.app(), base_url="http://testserver")


def _body(token_ids: list[int], n: int = 2, **settings: Any) -> dict[str, Any]:
    return {
        "requests": [{"token_ids": token_ids, "n": n, "seed": 7}],
        "settings": {**SETTINGS, **settings},
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], 'a "requests" list'),
        ({"requests": []}, '"settings" object'),
        ({"requests": [], "settings": SETTINGS}, "is empty"),
        ({"requests": [{"token_ids": [1], "n": 0, "seed": 1}], "settings": SETTINGS}, ".n must"),
        ({"requests": [{"token_ids": [20], "n": 1, "seed": 1}], "settings": SETTINGS}, "0 .. 19"),
        ({"requests": [{"token_ids": [1.5], "n": 1, "seed": 1}], "settings": SETTINGS}, "integer"),
        (
            {"requests": [{"token_ids": [1] * 13, "n": 1, "seed": 1}], "settings": SETTINGS},
            "exceed",
        ),
        ({"requests": [{"token_ids": [1], "n": 9, "seed": 1}], "settings": SETTINGS}, "at most 8"),
        (_body([1], top_p=0.0), "top_p in (0, 1]"),
        (_body([1], stop=[""]), "non-empty strings"),
        (_body([1], max_tokens=True), "integer, got bool"),
    ],
)
def test_malformed_generate_requests_say_what_is_wrong(data: Any, message: str) -> None:
    with pytest.raises(RequestError, match=re.escape(message)):
        parse_generate(data, ServerLimits(max_samples=8), MODEL)


def test_the_http_front_answers_4xx_with_a_reason(backend: CountingBackend) -> None:
    client = _client(backend, max_json_bytes=2048)
    health = client.get("/health").json()
    assert health["vocab_size"] == 20
    assert health["weights_version"] == 0
    cases = [
        (client.post("/generate", content=b"{not json"), 400, "not valid JSON"),
        (client.post("/generate", content=b"[" * 100_000), 413, "at most 2048"),
        (client.post("/generate", content=b"[" * 2000), 400, "not valid JSON"),
        (client.get("/generate"), 405, "GET is not allowed"),
        (client.get("/nowhere"), 404, "routes: /health"),
        (client.post("/weights", content=b"garbage"), 400, "not a safetensors file"),
    ]
    for reply, status, text in cases:
        assert reply.status_code == status, reply.text
        assert text in reply.json()["error"]


def test_a_token_is_required_when_set(backend: CountingBackend) -> None:
    client = _client(backend, token="s3cret")
    body = _body([5, 6, 7], stop_token_ids=[0])
    assert client.post("/generate", json=body).status_code == 401
    good = client.post("/generate", json=body, headers={"Authorization": "Bearer s3cret"})
    assert good.status_code == 200
    samples = good.json()["samples"]
    assert [s["token_ids"] for s in samples[0]] == [[7], [8]]  # seeds 7 and 7 + 1


def test_a_weight_push_of_the_wrong_shape_is_refused(backend: CountingBackend) -> None:
    server = RolloutServer(backend, "", None, {"w": (2, 3), "b": (3,)})
    client = TestClient(server.app())
    wrong = client.post("/weights", content=save({"w": torch.zeros(3)}))
    assert wrong.status_code == 400 and "has shape (3,)" in wrong.json()["error"]
    unknown = client.post("/weights", content=save({"nope": torch.zeros(1)}))
    assert unknown.status_code == 400 and "unknown weight 'nope'" in unknown.json()["error"]
    good = client.post("/weights", content=save({"w": torch.zeros(2, 3), "b": torch.ones(3)}))
    assert good.json() == {"tensors": 2, "weights_version": 1}
    assert [sorted(names) for names in backend.loads] == [["b", "w"]]


def _config(*overrides: str) -> Any:
    return get_recipe("llm_countdown_grpo").apply_overrides(
        [
            "train.prompts_per_iteration=4",
            "train.group_size=4",
            "train.minibatch_size=16",
            "eval.every=0",
            "logging.progress_bar=false",
            "logging.report_to=[]",
            "generation.engine=vllm_server",
            *overrides,
        ]
    )


@pytest.mark.slow
def test_grpo_trains_through_the_server_and_the_weights_follow(tmp_path: Path) -> None:
    served = TransformersBackend(CHECKPOINT)
    trainer = Trainer(_config("train.iterations=2"), run_dir=tmp_path / "run")
    engine = trainer.rollout.engine
    assert isinstance(engine, VLLMServerEngine)
    engine.client = _client(served)
    before = {k: v.clone() for k, v in trainer.policy.trainable_state_dict().items()}
    trainer.train()
    after = trainer.policy.trainable_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # the first rollout pushed the weights, and each iteration's update pushed them again
    assert served.loads == 3
    mine = trainer.policy.network.state_dict()
    for name, value in served.model.state_dict().items():
        assert torch.equal(value, mine[name]), name
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert all("time/weight_sync" in r for r in rows if "train_units" in r)


def test_an_absent_server_is_one_line_naming_the_url(tmp_path: Path) -> None:
    config = _config("train.iterations=1", "generation.engine_url=http://127.0.0.1:9")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    with pytest.raises(RolloutServerError, match=r"no rollout server answers at http://127\.0"):
        trainer.train()


def test_a_bad_engine_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="engine_url must be an http"):
        _config("generation.engine_url=localhost:8100").validate()
