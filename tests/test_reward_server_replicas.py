"""Replicas behind one endpoint, a bounded loopback load test, the pooled client, and
``genrl serve-reward``'s replica and front options."""

from __future__ import annotations

import copy
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from genrl.cli.main import main
from reward_models import RewardError, RewardOutput
from reward_models.color import TargetColorReward
from reward_models.remote import RemoteReward
from reward_models.serving.asgi import JSONH11Protocol
from reward_models.serving.requests import RequestError
from reward_models.serving.server import RewardServer
from reward_models.wire import encode_outputs, quantize


def images(n: int, seed: int) -> torch.Tensor:
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


def sent(batch: torch.Tensor) -> torch.Tensor:
    """The images as the server decodes them (8-bit PNG)."""
    return quantize(batch).float() / 255


class WaitsForOther(TargetColorReward):
    """A colour reward whose first call waits until ``other`` has scored something: only a
    second replica can let it finish, so a server that sends both requests to one replica
    fails the test (after 30 s) instead of passing by luck."""

    def __init__(self, other: Scored) -> None:
        super().__init__()
        self.other = other

    def score(self, outputs, prompts, metadata) -> RewardOutput:  # type: ignore[no-untyped-def]
        assert self.other.event.wait(30), "the other replica never scored"
        return super().score(outputs, prompts, metadata)


class Scored(TargetColorReward):
    def __init__(self) -> None:
        super().__init__()
        self.event = threading.Event()

    def score(self, outputs, prompts, metadata) -> RewardOutput:  # type: ignore[no-untyped-def]
        result = super().score(outputs, prompts, metadata)
        self.event.set()
        return result


@pytest.fixture
def servers() -> Iterator[list[RewardServer]]:
    started: list[RewardServer] = []
    yield started
    for server in started:
        server.shutdown()


def test_two_replicas_share_requests_and_score_as_one(servers) -> None:
    second = Scored()
    two = RewardServer([WaitsForOther(second), second], port=0).start()
    one = RewardServer(TargetColorReward(), port=0).start()
    servers += [two, one]
    batches = [images(2, seed=0), images(3, seed=1)]
    with ThreadPoolExecutor(2) as pool:
        futures = []
        for batch in batches:  # the first holds replica 0 until replica 1 has scored
            remote = RemoteReward(two.address, name="c", retries=0)
            futures.append(pool.submit(remote, batch, ["p"] * len(batch)))
            if not futures[1:]:
                until_busy(two)
        results = [f.result(timeout=60).scores["c"] for f in futures]
    assert [r.batch_sizes for r in two.replicas.members] == [[2], [3]]  # both replicas used
    single = RemoteReward(one.address, name="c", retries=0)
    for batch, scores in zip(batches, results, strict=True):
        assert torch.equal(scores, single(batch, ["p"] * len(batch)).scores["c"])
        local = TargetColorReward()(sent(batch), ["p"] * len(batch)).scores["target_color"]
        torch.testing.assert_close(scores, local, rtol=0, atol=1e-7)


def until_busy(server: RewardServer) -> None:
    """Wait until replica 0 holds a request (so the next one is dispatched elsewhere)."""
    for _ in range(3000):
        if server.replicas[0].load > 0:
            return
        time.sleep(0.01)
    raise AssertionError("replica 0 never got the first request")


class OtherColor(TargetColorReward):
    name = "other_color"


def test_replicas_must_be_distinct_copies_of_one_reward() -> None:
    reward = TargetColorReward()
    with pytest.raises(ValueError, match="distinct model instances"):
        RewardServer([reward, reward], port=0)
    with pytest.raises(ValueError, match="replica 1 is reward 'other_color'"):
        RewardServer([TargetColorReward(), OtherColor()], port=0)
    with pytest.raises(ValueError, match="replicas >= 1"):
        RewardServer([], port=0)


@pytest.mark.parametrize("replicas", [1, 2])
def test_32_concurrent_clients_each_get_exactly_their_own_rows(servers, replicas: int) -> None:
    """32 clients x 3 requests of 1 to 4 images each, all at once on loopback: every response
    holds the scores of its own images, in order, and every sample is scored exactly once.
    Bounded: 96 requests, each client with a 60 s timeout (a hang fails, nothing is timed)."""
    rewards = [TargetColorReward() for _ in range(replicas)]
    server = RewardServer(rewards, port=0, max_batch_size=8).start()
    servers.append(server)

    def client(index: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        remote = RemoteReward(server.address, name="c", retries=2, backoff_s=0.05, timeout_s=60)
        out = []
        for request in range(3):
            batch = images(1 + (index + request) % 4, seed=100 * index + request)
            out.append((batch, remote(batch, ["p"] * len(batch)).scores["c"]))
        remote.close()
        return out

    with ThreadPoolExecutor(32) as pool:
        answered = [f.result(timeout=120) for f in [pool.submit(client, i) for i in range(32)]]
    local = TargetColorReward()
    total = 0
    for batch, scores in (pair for pairs in answered for pair in pairs):
        expected = local(sent(batch), ["p"] * len(batch)).scores["target_color"]
        torch.testing.assert_close(scores, expected, rtol=0, atol=1e-7)
        total += len(batch)
    assert total == sum((1 + (i + r) % 4) for i in range(32) for r in range(3)) == 240
    assert sum(server.batch_sizes) == total  # none scored twice, none lost
    assert max(server.batch_sizes) <= 8
    assert all(r.load == 0 for r in server.replicas.members)


def test_the_client_keeps_its_connection_alive(servers, monkeypatch) -> None:
    connections: list[Any] = []
    accept = JSONH11Protocol.connection_made
    monkeypatch.setattr(
        JSONH11Protocol,
        "connection_made",
        lambda self, transport: (connections.append(transport), accept(self, transport)),
    )
    server = RewardServer(TargetColorReward(), port=0).start()
    servers.append(server)
    remote = RemoteReward(server.address, name="c", retries=0)
    for seed in range(3):
        remote(images(1, seed), ["p"])
    assert len(connections) == 1  # three requests, one TCP connection (the pool's)
    remote.close()
    remote(images(1, 0), ["p"])  # a closed pool opens a new one
    assert len(connections) == 2
    copied = copy.deepcopy(remote)  # a copy (or a pickled one) gets its own pool
    assert copied.client() is not remote.client()
    copied(images(1, 0), ["p"])
    assert len(connections) == 3


def test_refusals_fail_at_once_without_retrying(servers, monkeypatch) -> None:
    server = RewardServer(TargetColorReward(), port=0, token="t", max_request_bytes=200).start()
    servers.append(server)
    sleeps: list[float] = []
    monkeypatch.setattr(
        "reward_models.remote.time", SimpleNamespace(sleep=sleeps.append, monotonic=time.monotonic)
    )
    remote = RemoteReward(server.address, name="c", token="t", retries=3)
    with pytest.raises(RewardError, match=r"\(413\)"):
        remote(images(4, 0), ["p"] * 4)
    with pytest.raises(RewardError, match=r"\(400\).*accepts images, not texts"):
        remote(["a text"], ["p"])
    with pytest.raises(RewardError, match="rejected the token"):
        RemoteReward(server.address, name="c", token="wrong", retries=3)(images(1, 0), ["p"])
    assert sleeps == []  # no back-off: none of them was retried


def test_serve_reward_builds_one_replica_per_device(monkeypatch, capsys) -> None:
    seen: list[RewardServer] = []

    def serve(self: RewardServer) -> None:
        seen.append(self)
        self.shutdown()

    monkeypatch.setattr(RewardServer, "serve_forever", serve)
    command = ["serve-reward", "digit_classifier", "--port", "0", "--devices", "cpu,cpu"]
    assert main(command) == 0
    (server,) = seen
    models = [replica.reward for replica in server.replicas.members]
    assert [m.device.type for m in models] == ["cpu", "cpu"]  # type: ignore[attr-defined]
    assert models[0] is not models[1]  # one instance per replica
    assert server.describe()["replicas"] == 2
    assert "2 replica(s) on cpu, cpu" in capsys.readouterr().out
    assert main([*command[:4], "--replicas", "4", "--devices", "cpu"]) == 0
    assert len(seen[1].replicas) == 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--replicas", "3", "--devices", "cpu,cpu"], "cannot be spread evenly"),
        (["--replicas", "0"], "--replicas must be >= 1"),
        (["--devices", "cpu,"], "comma-separated device names"),
        (["--devices", "cpu", "--kwargs", '{"device": "cpu"}'], "not both"),
    ],
)
def test_serve_reward_names_a_bad_replica_option(capsys, options: list[str], message) -> None:
    assert main(["serve-reward", "digit_classifier", "--port", "0", *options]) == 2
    assert message in capsys.readouterr().err


def test_serve_reward_without_the_server_extra_says_what_to_install(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn raises ImportError
    assert main(["serve-reward", "digit_classifier", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'genrl[server]'" in err and len(err.strip().splitlines()) == 1


def raw(address: str, data: bytes) -> bytes:
    host, port = address.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def chunked(body: bytes, piece: int = 100) -> bytes:
    parts = [body[i : i + piece] for i in range(0, len(body), piece)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_the_server_takes_chunked_bodies_within_the_size_limit(servers) -> None:
    """No Content-Length: the server reads the chunks and refuses with 413 as soon as they pass
    ``max_request_bytes``."""
    body = json.dumps({"version": 1, "prompts": ["p"], "outputs": encode_outputs(images(1, 0))})
    server = RewardServer(TargetColorReward(), port=0, max_request_bytes=len(body)).start()
    servers.append(server)
    head = b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    reply = raw(server.address, head + b"Connection: close\r\n\r\n" + chunked(body.encode()))
    assert reply.startswith(b"HTTP/1.1 200") and b'"target_color": [' in reply
    server.max_request_bytes = len(body) - 1
    reply = raw(server.address, head + b"\r\n" + chunked(body.encode()))
    assert reply.startswith(b"HTTP/1.1 413") and b"exceeds" in reply


def test_requests_after_shutdown_get_503_and_give_their_pixels_back() -> None:
    server = RewardServer(TargetColorReward(), port=0)
    server.shutdown()  # the workers are stopped: nothing would ever score a queued job
    request = server.parse(
        json.dumps(
            {"version": 1, "prompts": ["p"], "outputs": encode_outputs(images(1, 0))}
        ).encode()
    )
    job = server.admit(request, "id")
    assert server.limits.pixels.in_use == 64
    with pytest.raises(RequestError) as refused:
        server.dispatch(job)
    assert refused.value.status == 503 and refused.value.headers == {"Retry-After": "1"}
    assert server.limits.pixels.in_use == 0
