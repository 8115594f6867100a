"""The reward server's refusals and limits: accepted kinds and encodings, JSON on every reply,
internal errors kept in the server log, the server-wide pixel budget and decode slots."""

from __future__ import annotations

import base64
import io
import json
import logging
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from email.message import Message
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import reward_models.serving.requests as server_requests
from reward_models import (
    CallableReward,
    CompositeReward,
    RewardError,
    RewardModel,
    RewardOutput,
    build_reward,
)
from reward_models.color import TargetColorReward
from reward_models.corrected import CorrectedScore
from reward_models.remote import RemoteReward
from reward_models.serving.requests import PixelBudget
from reward_models.serving.server import RewardServer
from reward_models.text import CountdownReward
from reward_models.wire import encode_outputs


def images(n: int, size: int = 8) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(0))


def image_body(n: int = 1, size: int = 8) -> bytes:
    request = {"version": 1, "prompts": ["p"] * n, "outputs": encode_outputs(images(n, size))}
    return json.dumps(request).encode()


def post(address: str, body: bytes, path: str = "/score") -> tuple[int, Message, dict]:
    """(status, headers (names in any case), JSON body) of one request, refusals included."""
    request = urllib.request.Request(address + path, body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.headers, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, err.headers, json.loads(err.read())


def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def serve() -> Iterator[Callable[..., RewardServer]]:
    servers: list[RewardServer] = []

    def start(reward: RewardModel, **kwargs: Any) -> RewardServer:
        servers.append(RewardServer(reward, port=0, **kwargs).start())
        return servers[-1]

    yield start
    for server in servers:
        server.shutdown()


class Gate(RewardModel):
    """Scores zeros once ``opened`` is set: holds a request in the scoring thread."""

    name = "gate"
    accepts = ("images",)

    def __init__(self) -> None:
        self.entered, self.opened = threading.Event(), threading.Event()

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        self.entered.set()
        assert self.opened.wait(30)
        return RewardOutput({self.name: torch.zeros(len(prompts))})


def in_background(function: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(function()))
    thread.start()
    return thread, result


# -- what a reward accepts ----------------------------------------------------------------------
def test_outputs_of_a_kind_the_reward_does_not_take_get_a_400_naming_what_it_takes(serve) -> None:
    color = serve(TargetColorReward())
    texts = json.dumps({"version": 1, "prompts": ["p"], "outputs": {"texts": ["a"]}}).encode()
    status, _, reply = post(color.address, texts)
    assert status == 400 and "'target_color' accepts images, not texts" in reply["error"]
    countdown = serve(CountdownReward())
    status, _, reply = post(countdown.address, image_body())
    assert status == 400 and "'countdown' accepts texts, not images" in reply["error"]
    with urllib.request.urlopen(color.address + "/health", timeout=10) as health:
        assert json.loads(health.read())["accepts"] == ["images"]


def test_composites_accept_what_all_their_rewards_accept() -> None:
    anything = CallableReward(lambda prompts, completions: [0.0] * len(prompts), name="zero")
    assert anything.accepts == ("images", "videos", "texts")
    assert CompositeReward([(TargetColorReward(), 1.0), (anything, 1.0)]).accepts == ("images",)
    assert CompositeReward([(TargetColorReward(), 1.0), (CountdownReward(), 1.0)]).accepts == ()
    corrected = build_reward("corrected_score", reward={"name": "target_color"},
                             quality={"name": "countdown"})  # fmt: skip
    assert corrected.accepts == ()
    assert build_reward("corrected_score", reward={"name": "target_color"}, quality={
        "name": "overlong_penalty", "kwargs": {"max_length": 4, "buffer": 2}}).accepts == ("images",)  # fmt: skip
    with pytest.raises(TypeError, match="takes built rewards"):
        CorrectedScore({"name": "target_color"}, {"name": "countdown"})  # type: ignore[arg-type]


# -- image encodings ----------------------------------------------------------------------------
def encoded(format: str, mode: str = "RGB") -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new(mode, (4, 4)).save(buffer, format=format)
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize(
    ("item", "named"),
    [
        (lambda: encoded("JPEG"), "is a JPEG"),
        (lambda: encoded("GIF"), "is a GIF"),
        (lambda: encoded("BMP"), "is a BMP"),
        (lambda: encoded("PNG", mode="I;16"), "mode 'I;16'"),
        (lambda: base64.b64encode(b"plain bytes").decode(), "no PNG signature"),
    ],
)
def test_images_the_wire_format_does_not_name_get_415(serve, item, named: str) -> None:
    server = serve(TargetColorReward())
    body = json.dumps({"version": 1, "prompts": ["p"], "outputs": {"images": [item()]}})
    status, _, reply = post(server.address, body.encode())
    assert status == 415 and named in reply["error"]
    assert "8-bit PNG" in reply["error"]  # what is accepted instead


# -- JSON replies, request ids, the server log --------------------------------------------------
def raw_reply(address: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes over one connection; the status, headers and body of the reply."""
    host, port = address.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"PUT /score HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 501),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        (b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", 431),
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"b" * 70_000 + b"\r\n\r\n", 431),
        (b"GET / too many words HTTP/1.1\r\n\r\n", 400),
        (b"GET /health HTTP/one\r\n\r\n", 400),
        (b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    ],
)
def test_every_reply_is_json_with_an_error_and_a_request_id(
    serve, request_bytes: bytes, status: int
) -> None:
    server = serve(TargetColorReward())
    got, headers, body = raw_reply(server.address, request_bytes)
    assert got == status
    assert headers["content-type"] == "application/json"
    reply = json.loads(body)
    assert reply["error"] and reply["request_id"] == headers["x-request-id"]


class Failing(RewardModel):
    name = "failing"

    def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
        raise RuntimeError("secret detail: /srv/models/weights.pt is corrupt")


def test_internal_errors_are_logged_under_the_request_id_not_sent(serve, caplog) -> None:
    caplog.set_level(logging.INFO, logger="reward_models.serving.server")
    server = serve(Failing())
    status, headers, reply = post(server.address, image_body())
    assert status == 500 and "secret" not in json.dumps(reply)
    request_id = reply["request_id"]
    assert request_id == headers["X-Request-Id"] and request_id in reply["error"]
    logged = [r for r in caplog.records if r.exc_info and request_id in r.getMessage()]
    assert len(logged) == 1 and "secret detail" in caplog.text


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_client_that_leaves_mid_body_is_logged_in_one_line(
    serve, caplog, capfd, reset: bool
) -> None:
    caplog.set_level(logging.INFO, logger="reward_models.serving.server")
    server = serve(TargetColorReward())
    host, port = server.address.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)), timeout=10)
    connection.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{partial")
    if reset:  # close with RST instead of FIN: the server's read fails instead of ending short
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()
    records = lambda: [r for r in caplog.records if r.name == "reward_models.serving.server"]  # noqa: E731
    until(lambda: len(records()) >= 1, "the server to log the lost client")
    time.sleep(0.3)  # a second record or a traceback would come within this
    assert len(records()) == 1 and records()[0].exc_info is None
    assert "Traceback" not in capfd.readouterr().err


# -- the server-wide pixel budget and decode slots ----------------------------------------------
def test_pixel_budget_serves_waiters_first_come_first_served() -> None:
    budget = PixelBudget(100)
    assert budget.acquire(60, timeout=0)
    assert not budget.acquire(50, timeout=0)  # 110 > 100, and no wait allowed
    order: list[str] = []
    first, _ = in_background(lambda: budget.acquire(60, timeout=30) and order.append("60"))
    until(lambda: budget.waiting == 1, "the first waiter")
    # 30 would fit next to the 60 in use, but the waiter for 60 came first.
    second, _ = in_background(lambda: budget.acquire(30, timeout=30) and order.append("30"))
    until(lambda: budget.waiting == 2, "the second waiter")
    assert order == []
    budget.release(60)
    first.join(), second.join()
    assert order == ["60", "30"] and budget.in_use == 90 and budget.waited == 3
    assert budget.try_acquire(10) and not budget.try_acquire(1)
    with pytest.raises(ValueError, match="never fit"):
        budget.acquire(101, timeout=0)


def test_requests_beyond_the_pixel_budget_get_503_with_retry_after(serve) -> None:
    gate = Gate()
    server = serve(gate, pixel_budget=100, max_pixels=100, max_wait_s=0)
    holder, held = in_background(lambda: post(server.address, image_body()))  # 64 pixels
    until(lambda: server.limits.pixels.in_use == 64, "the first request to take its pixels")
    status, headers, reply = post(server.address, image_body())
    assert status == 503 and headers["Retry-After"] == "1"
    assert "do not fit the server's budget" in reply["error"]
    texts = json.dumps({"version": 1, "prompts": ["p"], "outputs": {"texts": ["a"]}}).encode()
    assert post(server.address, texts)[0] == 400  # the gate takes images only; checked first
    gate.opened.set()
    holder.join()
    assert held[0][0] == 200
    until(lambda: server.limits.pixels.in_use == 0, "the pixels to be given back")
    assert post(server.address, image_body())[0] == 200


def test_requests_wait_for_the_budget_within_max_wait_s(serve) -> None:
    gate = Gate()
    server = serve(gate, pixel_budget=100, max_pixels=100, max_wait_s=60)
    first, first_reply = in_background(lambda: post(server.address, image_body()))
    until(lambda: server.limits.pixels.in_use == 64, "the first request to take its pixels")
    second, second_reply = in_background(lambda: post(server.address, image_body()))
    until(lambda: server.limits.pixels.waiting == 1, "the second request to queue")
    gate.opened.set()
    first.join(), second.join()
    assert first_reply[0][0] == second_reply[0][0] == 200
    assert server.limits.pixels.waited == 1


def test_decodes_at_once_are_capped(serve, monkeypatch) -> None:
    entered, release = threading.Event(), threading.Event()
    decode = server_requests.decode_images

    def held_decode(pictures: list[Any]) -> torch.Tensor:
        entered.set()
        assert release.wait(30)
        return decode(pictures)

    monkeypatch.setattr(server_requests, "decode_images", held_decode)
    server = serve(TargetColorReward(), max_decodes=1, max_wait_s=0)
    holder, held = in_background(lambda: post(server.address, image_body()))
    assert entered.wait(20)
    status, headers, reply = post(server.address, image_body())
    assert status == 503 and "all 1 decode slots are in use" in reply["error"]
    assert headers["Retry-After"] == "1"
    release.set()
    holder.join()
    assert held[0][0] == 200
    until(lambda: server.limits.pixels.in_use == 0, "the pixels to be given back")


@pytest.mark.slow
@pytest.mark.parametrize(("budget", "batches"), [(200, [1, 1, 1]), (400, [1, 2])])
def test_a_merge_of_requests_is_taken_from_the_budget(serve, budget, batches) -> None:
    """A, B (64 pixels each) queue behind X; merging them copies 128 more pixels, which fit a
    budget of 400 but not one of 200 (64 + 64 + 128 > 200): then they are scored one by one."""
    gate = Gate()
    server = serve(gate, pixel_budget=budget, max_pixels=100, batch_wait_s=1.0)
    x, _ = in_background(lambda: post(server.address, image_body()))
    assert gate.entered.wait(20)  # X is being scored: A and B cannot join its batch
    a, _ = in_background(lambda: post(server.address, image_body()))
    b, _ = in_background(lambda: post(server.address, image_body()))
    until(lambda: server.replicas[0].jobs.qsize() == 2, "A and B to be queued")
    gate.opened.set()
    for thread in (x, a, b):
        thread.join()
    assert server.batch_sizes == batches
    until(lambda: server.limits.pixels.in_use == 0, "the pixels to be given back")


def test_the_per_request_limit_must_fit_the_budget() -> None:
    with pytest.raises(ValueError, match="must fit the pixel budget"):
        RewardServer(TargetColorReward(), port=0, max_pixels=200, pixel_budget=100)


def test_the_client_waits_at_least_retry_after(serve, monkeypatch) -> None:
    gate = Gate()
    server = serve(gate, pixel_budget=64, max_pixels=64, max_wait_s=0)
    holder, _ = in_background(lambda: post(server.address, image_body()))
    until(lambda: server.limits.pixels.in_use == 64, "the first request to take its pixels")
    sleeps: list[float] = []
    monkeypatch.setattr(
        "reward_models.remote.time", SimpleNamespace(sleep=sleeps.append, monotonic=time.monotonic)
    )
    remote = RemoteReward(server.address, name="gate", retries=2, backoff_s=0.01)
    with pytest.raises(RewardError, match=r"failed 3 times.*HTTP 503.*budget"):
        remote(images(1), ["p"])
    assert sleeps == [1.0, 1.0]  # Retry-After, not the 0.01 and 0.02 s back-off
    gate.opened.set()
    holder.join()
