"""Slow or broken peers do not hold the reward server's connections: a request head that does
not arrive within ``header_timeout_s`` gets a 408 and a close, bytes that cannot be a request
line get a 400 and a close at once, and connections beyond ``max_connections`` are refused with
a 503 on arrival, while a healthy client is served throughout. Short limits keep every test
bounded (each wait has a deadline)."""

from __future__ import annotations

import http.client
import json
import random
import select
import socket
import threading
import time
from typing import Any

import pytest

from reward_models.color import TargetColorReward
from reward_models.serving.server import RewardServer
from tests.test_reward_server_limits import image_body, post, serve, until  # noqa: F401

HEAD_TIMEOUT = 0.5
SLACK = 2.5  # a loaded machine's scheduling delay on top of a limit, at most


def connect(server: RewardServer) -> socket.socket:
    host, port = server.address.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def reply_of(connection: socket.socket, deadline: float) -> tuple[int, dict[str, Any], float]:
    """Read until the server closes: (status, JSON body, seconds until the close); the status
    is 0 if it closed without a reply."""
    chunks = []
    while time.monotonic() < deadline:
        readable, _, _ = select.select([connection], [], [], 0.05)
        if readable:
            try:
                chunk = connection.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                data = b"".join(chunks)
                if not data:
                    return 0, {}, time.monotonic()
                head, _, body = data.partition(b"\r\n\r\n")
                return int(head.split()[1]), json.loads(body), time.monotonic()
            chunks.append(chunk)
    raise AssertionError("the server kept the connection open past the deadline")


def open_connections(server: RewardServer) -> int:
    return len(server._front._uvicorn.server_state.connections)


def slow_header_client(server: RewardServer, results: list[Any], interval: float) -> None:
    """Send a request head one header line every ``interval`` seconds until closed; append
    (status, body, seconds connected, when it was closed)."""
    started = time.monotonic()
    with connect(server) as connection:
        connection.sendall(b"POST /score HTTP/1.1\r\n")
        line = 0
        while time.monotonic() < started + 20:
            readable, _, _ = select.select([connection], [], [], interval)
            if readable:  # the server answered (and is closing): read it all
                status, body, closed = reply_of(connection, started + 20)
                results.append((status, body, closed - started, closed))
                return
            try:
                connection.sendall(b"X-Slow-%d: still coming\r\n" % line)
            except (BrokenPipeError, ConnectionResetError):
                results.append((0, {}, time.monotonic() - started, time.monotonic()))
                return
            line += 1
    results.append(("still open", {}, 20.0, time.monotonic()))


@pytest.mark.slow
def test_slow_header_clients_are_closed_within_the_limit_while_a_healthy_one_is_served(
    serve,  # noqa: F811
) -> None:
    limit = 3.0  # long enough for the healthy requests to finish before any slow one is closed
    server = serve(TargetColorReward(), header_timeout_s=limit)
    assert post(server.address, image_body(2))[0] == 200  # warm: imports, first decode
    results: list[Any] = []
    threads = [
        threading.Thread(target=slow_header_client, args=(server, results, 0.1)) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    until(lambda: open_connections(server) == 8, "the 8 slow clients to connect")
    for _ in range(3):  # while the slow ones hold their connections
        status, _, reply = post(server.address, image_body(2))
        assert status == 200 and len(reply["scores"]["target_color"]) == 2
    healthy_done = time.monotonic()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == 8
    for status, body, seconds, _ in results:
        assert status == 408
        assert body["error"] == f"request head not received within {limit:g} s"
        assert limit - 0.05 <= seconds < limit + SLACK
    # Served while all 8 were still connected: they did not hold the healthy client up.
    assert healthy_done < min(closed for *_, closed in results)


def test_a_connection_that_sends_nothing_gets_408(serve) -> None:  # noqa: F811
    server = serve(TargetColorReward(), header_timeout_s=HEAD_TIMEOUT)
    with connect(server) as connection:
        started = time.monotonic()
        status, body, closed = reply_of(connection, started + 10)
    assert (status, body["error"]) == (408, "request head not received within 0.5 s")
    assert closed - started < HEAD_TIMEOUT + SLACK


def random_bytes(size: int, line_every: int | None) -> bytes:
    data = bytearray(random.Random(size).randbytes(size).replace(b"\r", b"").replace(b"\n", b""))
    if line_every:
        for at in range(line_every, len(data), line_every):
            data[at : at + 2] = b"\r\n"
    return bytes(data)


@pytest.mark.parametrize(
    "garbage",
    [random_bytes(2048, None), random_bytes(2048, 100), random_bytes(2048, 100) + b"\r\n\r\n"],
    ids=["no line end", "line ends", "a whole head"],
)
def test_garbage_bytes_get_400_and_a_close_at_once(serve, garbage: bytes) -> None:  # noqa: F811
    server = serve(TargetColorReward(), header_timeout_s=30)  # the timer is not what closes it
    with connect(server) as connection:
        started = time.monotonic()
        connection.sendall(garbage)
        status, body, closed = reply_of(connection, started + 10)
    assert status == 400 and body["error"].startswith("invalid HTTP request: ")
    assert closed - started < SLACK


def test_printable_bytes_that_never_end_a_line_get_408(serve) -> None:  # noqa: F811
    server = serve(TargetColorReward(), header_timeout_s=HEAD_TIMEOUT)
    with connect(server) as connection:
        started = time.monotonic()
        connection.sendall(b"A" * 2048)  # could still be a (long) method name
        status, body, closed = reply_of(connection, started + 10)
    assert (status, body["error"]) == (408, "request head not received within 0.5 s")
    assert closed - started < HEAD_TIMEOUT + SLACK


@pytest.mark.slow
def test_a_kept_alive_connection_may_idle_past_the_head_timeout(serve) -> None:  # noqa: F811
    """The head timer runs from a request's first byte, not over the idle time between
    requests (RemoteReward's pooled connections idle up to 30 s)."""
    server = serve(TargetColorReward(), header_timeout_s=HEAD_TIMEOUT)
    host, port = server.address.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", "/health")
        assert connection.getresponse().read() and connection.sock is not None
        first = connection.sock
        time.sleep(HEAD_TIMEOUT * 3)
        connection.request("GET", "/health")
        reply = connection.getresponse()
        assert reply.status == 200 and json.loads(reply.read())["reward"] == "target_color"
        assert connection.sock is first  # the same connection served both
        # A head dripped on the kept-alive connection is timed from its first byte.
        first.sendall(b"GET /health HTTP/1.1\r\n")
        status, body, _ = reply_of(first, time.monotonic() + 10)
        assert (status, body["error"]) == (408, "request head not received within 0.5 s")
    finally:
        connection.close()


def test_connections_beyond_the_cap_get_503_on_arrival(serve) -> None:  # noqa: F811
    server = serve(TargetColorReward(), header_timeout_s=30, max_connections=4)
    held = [connect(server) for _ in range(4)]
    try:
        until(lambda: open_connections(server) == 4, "the server to accept 4 connections")
        with connect(server) as extra:
            started = time.monotonic()
            status, body, closed = reply_of(extra, started + 10)
        assert (status, body["error"]) == (503, "the server is at its limit of 4 connections")
        assert closed - started < SLACK
        held.pop().close()
        until(lambda: open_connections(server) == 3, "the server to see a connection close")
        assert post(server.address, image_body(1))[0] == 200  # room again
    finally:
        for connection in held:
            connection.close()


def test_health_reports_the_connection_limits(serve) -> None:  # noqa: F811
    server = serve(TargetColorReward(), header_timeout_s=2.5, max_connections=9)
    limits = server.describe()["limits"]
    assert (limits["header_timeout_s"], limits["max_connections"]) == (2.5, 9)
    default = serve(TargetColorReward()).describe()["limits"]
    assert (default["header_timeout_s"], default["max_connections"]) == (10.0, 512)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [([], (10.0, 512)), (["--header-timeout", "2.5", "--max-connections", "7"], (2.5, 7))],
    ids=["defaults", "set"],
)
def test_serve_reward_flags_set_the_connection_limits(monkeypatch, flags, expected) -> None:
    from genrl.cli.main import main

    seen: list[dict[str, Any]] = []

    def serve_once(self: RewardServer) -> None:  # what /health would say, then stop
        seen.append(self.describe()["limits"])
        self.shutdown()

    monkeypatch.setattr(RewardServer, "serve_forever", serve_once)
    assert main(["serve-reward", "digit_classifier", "--port", "0", *flags]) == 0
    assert (seen[0]["header_timeout_s"], seen[0]["max_connections"]) == expected
