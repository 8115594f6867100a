"""The reward server blames the user when the user is at fault: a request over a limit that
``/health`` reports is a 400, and input the reward says it cannot score (a prompt without a
digit, an image of another size or channel count) a 422 with the reward's message, both
decided before any image is decoded; a reward's own failures stay 500."""

from __future__ import annotations

import base64
import io
import json
import logging
import threading
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import reward_models.serving.requests as server_requests
from reward_models import RewardInputError, RewardOutput
from reward_models.color import TargetColorReward
from reward_models.digits import DigitClassifierReward
from reward_models.serving.limits import json_depth
from reward_models.serving.server import RewardServer
from reward_models.wire import encode_outputs
from tests.test_reward_server_limits import in_background, post, until


def png(mode: str, size: tuple[int, int], color: Any = 0) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new(mode, size, color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def body(prompts: list[str], outputs: dict[str, Any]) -> bytes:
    return json.dumps({"version": 1, "prompts": prompts, "outputs": outputs}).encode()


def digits(n: int) -> dict[str, Any]:
    return encode_outputs(torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(n)))


@pytest.fixture
def serve() -> Iterator[Callable[..., RewardServer]]:
    servers: list[RewardServer] = []

    def start(reward: Any, **kwargs: Any) -> RewardServer:
        servers.append(RewardServer(reward, port=0, **kwargs).start())
        return servers[-1]

    yield start
    for server in servers:
        server.shutdown()


@pytest.fixture
def no_decoding(monkeypatch) -> None:
    """Fail the test if the server decodes an image: every refusal here comes first."""

    def refuse(pictures: list[Any]) -> torch.Tensor:
        raise AssertionError(f"decoded {len(pictures)} images of a request to refuse")

    monkeypatch.setattr(server_requests, "decode_images", refuse)


SHAPE = "reward 'digit_classifier' scores 8x8 grayscale images ([B, 1, 8, 8]), got "
NO_DIGIT = "digit_classifier cannot score prompt 1: prompt 'a cat' names no digit; accepted forms"
CASES = {
    "a prompt without a digit": (
        body(["digit 3", "a cat"], digits(2)),
        422,
        NO_DIGIT,
    ),
    "a 64x64 RGB image": (
        body(["digit 3"], {"images": [png("RGB", (64, 64))]}),
        422,
        SHAPE + "3-channel 64x64 (image 0: PNG mode 'RGB')",
    ),
    "an RGBA image": (
        body(["digit 3"], {"images": [png("RGBA", (8, 8))]}),
        422,
        SHAPE + "3-channel 8x8 (image 0: PNG mode 'RGBA', decoded as RGB, alpha dropped)",
    ),
    "a 1x1 image": (
        body(["digit 3"], {"images": [png("L", (1, 1))]}),
        422,
        SHAPE + "1-channel 1x1 (image 0: PNG mode 'L')",
    ),
    "two 5000x5000 images": (
        body(["digit 3"] * 2, {"images": [png("L", (5000, 5000))] * 2}),
        422,
        SHAPE + "1-channel 5000x5000 (image 0: PNG mode 'L')",
    ),
    "1,000 small images": (
        body(["digit 3"] * 1000, digits(1000)),
        400,
        "1000 samples exceed the server's limit of 512 per request (limits.max_samples in GET "
        "/health); send smaller requests (RemoteReward's max_batch_size)",
    ),
    "a 10 MB prompt list": (  # 500 prompts of 20,008 bytes: within the sample limit
        body(["digit 3 " + "x" * 20_000] * 500, digits(500)),
        400,
        "the prompts hold 10004000 bytes, over the server's limit of 1048576 per request "
        "(limits.max_prompt_bytes in GET /health)",
    ),
    "a boolean version": (  # True == 1 in Python: the type is what tells them apart
        b'{"version": true, "prompts": ["digit 3"], "outputs": {"texts": ["a"]}}',
        400,
        '"version" (the wire version) must be the integer 1, got True',
    ),
    "a float version": (
        b'{"version": 1.0, "prompts": ["digit 3"], "outputs": {"texts": ["a"]}}',
        400,
        '"version" (the wire version) must be the integer 1, got 1.0',
    ),
    "deeply nested JSON": (
        b'{"version": 1, "prompts": ["3"], "metadata": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b', "outputs": {"texts": ["a"]}}',
        400,
        "JSON nested deeper than the server's limit of 32 levels (limits.max_json_depth in "
        "GET /health)",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_input_is_a_4xx_that_says_what_was_wrong(
    serve, no_decoding, caplog, case: str
) -> None:
    caplog.set_level(logging.INFO, logger="reward_models.serving.server")
    server = serve(DigitClassifierReward())
    request, status, message = CASES[case]
    got, _, reply = post(server.address, request)
    assert (got, reply["error"][: len(message)]) == (status, message)
    assert not [r for r in caplog.records if r.exc_info]  # no traceback: not the server's fault
    assert server.limits.pixels.in_use == 0  # nothing taken from the budget


def test_health_reports_the_limits_and_what_the_reward_scores(serve) -> None:
    server = serve(DigitClassifierReward(), max_samples=100, max_prompt_bytes=5000)
    with urllib.request.urlopen(server.address + "/health", timeout=10) as reply:
        health = json.loads(reply.read())
    assert health["image_channels"] == [1] and health["image_size"] == [8, 8]
    limits = health["limits"]
    assert (limits["max_samples"], limits["max_prompt_bytes"], limits["max_json_depth"]) == (
        100,
        5000,
        32,
    )
    assert post(server.address, body(["digit 3"] * 101, digits(101)))[0] == 400
    assert post(server.address, body(["digit 3"] * 100, digits(100)))[0] == 200
    assert post(server.address, body(["3" * 2501] * 2, digits(2)))[0] == 400  # 5002 bytes


def test_rgba_is_scored_as_its_rgb_channels(serve) -> None:
    """The wire format converts RGBA to RGB (alpha dropped, not composited): a reward that
    takes RGB scores an RGBA image as the same image without alpha."""
    server = serve(TargetColorReward())
    rgba = post(server.address, body(["p"], {"images": [png("RGBA", (4, 4), (255, 0, 0, 10))]}))
    rgb = post(server.address, body(["p"], {"images": [png("RGB", (4, 4), (255, 0, 0))]}))
    assert rgba[0] == rgb[0] == 200
    assert rgba[2]["scores"]["target_color"] == rgb[2]["scores"]["target_color"] == [1.0]


def test_json_depth_ignores_brackets_in_strings() -> None:
    assert json_depth(b'{"a": [1, {"b": "[[[[\\" ["}]}') == 3
    assert json_depth(b'{"images": ["' + b"[" * 1000 + b'"]}') == 2
    assert json_depth(b"[" * 40 + b"]" * 40) == 40
    assert json_depth(b"") == 0


class PicksPrompts(TargetColorReward):
    """Refuses prompts "bad ..." only once scoring (no ``check_prompts``), after ``opened``:
    holds the worker so that requests queue and merge behind the first."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.opened = threading.Event(), threading.Event()
        self.calls: list[list[str]] = []

    def score(self, outputs, prompts, metadata) -> RewardOutput:  # type: ignore[no-untyped-def]
        self.entered.set()
        assert self.opened.wait(30)
        self.calls.append(list(prompts))
        bad = [p for p in prompts if p.startswith("bad")]
        if bad:
            raise RewardInputError(f"cannot score {bad[0]!r}")
        return super().score(outputs, prompts, metadata)


@pytest.mark.slow
def test_a_refused_request_does_not_fail_those_merged_with_it(serve) -> None:
    reward = PicksPrompts()
    server = serve(reward, batch_wait_s=1.0)
    image = {"images": [png("RGB", (4, 4), (255, 0, 0))]}
    first, first_reply = in_background(lambda: post(server.address, body(["first"], image)))
    assert reward.entered.wait(20)  # the first is being scored: the others queue behind it
    threads = []
    for prompt in ("good a", "bad b", "good c"):
        threads.append(in_background(lambda p=prompt: post(server.address, body([p], image))))
        until(lambda: server.replicas[0].jobs.qsize() == len(threads), "a request to queue")
    reward.opened.set()
    first.join()
    for thread, _ in threads:
        thread.join()
    assert first_reply[0][0] == 200
    assert [t[1][0][0] for t in threads] == [200, 422, 200]
    assert threads[1][1][0][2]["error"] == "cannot score 'bad b'"
    # The merge failed as a whole, then each request was scored alone; the replica stays.
    assert reward.calls == [["first"], ["good a", "bad b", "good c"], ["good a"], ["bad b"],
                            ["good c"]]  # fmt: skip
    assert server.describe()["replica_health"][0]["state"] == "healthy"
