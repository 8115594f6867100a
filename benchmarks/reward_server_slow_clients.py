"""How many slow-header clients the reward server survives while a healthy client is served.

The server runs in a child process with its default connection limits (``header_timeout_s``
10 s, ``max_connections`` 512) and a reward that sleeps ``--batch-ms`` per call. For each number
K of slow clients (``--levels``, 0, 16, 64 and 256 by default; a K over ``max_connections``
shows what the cap does), K connections each send a request line, then one header line every
``--drip-s`` seconds, never finishing the head; one the server closes is opened again after
``--drip-s``, so K stay connected (a persistent attacker). Once they are connected, a healthy
client (httpx with a keep-alive connection, as ``RemoteReward`` sends) posts requests of
``--images`` images one after the other for ``--seconds``. Per K: whether every healthy
request got a 200 within 1 s, its p50/p99/max latency, and what the server did with the slow
ones (closed with 408, refused with 503 at the cap, the longest any was held). The headline
``slow_clients_survived`` is the largest K up to which every level passed.

    python benchmarks/reward_server_slow_clients.py [--levels 0,16,64,256] [--seconds 11]

Ends with one JSON object on its last line (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import statistics
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from reward_server import request_body, sleep_reward, spawn_server

HEALTHY_WITHIN_S = 1.0


def serve(args: argparse.Namespace) -> None:
    """Child process: serve the sleep reward with the default limits until killed."""
    import torch

    from reward_models.serving.server import RewardServer

    torch.set_num_threads(1)
    server = RewardServer(sleep_reward(args.batch_ms), port=0)
    print(server.address, flush=True)
    server.serve_forever()


class SlowClients:
    """``count`` slow-header connections kept open from one thread (reopened when closed)."""

    def __init__(self, address: str, count: int, drip_s: float) -> None:
        host, port = address.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.count, self.drip_s = count, drip_s
        self.open: dict[socket.socket, float] = {}  # socket -> when it connected
        self.replies: Counter[int] = Counter()  # status of each reply a slow client got
        self.held_s: list[float] = []  # how long each closed one was connected
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self, timeout: float = 60.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while len(self.open) < self.count and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        for connection in list(self.open):
            connection.close()

    def _connect(self) -> None:
        try:
            connection = socket.create_connection(self.target, timeout=5)
            connection.sendall(b"POST /score HTTP/1.1\r\nHost: slow\r\n")
        except OSError:
            return  # the next round tries again
        self.open[connection] = time.monotonic()

    def _run(self) -> None:
        line = 0
        while not self.stop.is_set():
            for _ in range(self.count - len(self.open)):
                self._connect()
            round_ends = time.monotonic() + self.drip_s
            while (left := round_ends - time.monotonic()) > 0 and not self.stop.is_set():
                readable, _, _ = select.select(list(self.open), [], [], min(left, 0.1))
                for connection in readable:  # the server answered and closes: record it
                    self._closed(connection)
            for connection in list(self.open):
                try:
                    connection.sendall(b"X-Slow-%d: still coming\r\n" % line)
                except OSError:
                    self._closed(connection)
            line += 1

    def _closed(self, connection: socket.socket) -> None:
        try:
            data = connection.recv(65536)
        except OSError:
            data = b""
        self.replies[int(data.split()[1]) if data.startswith(b"HTTP/") else 0] += 1
        self.held_s.append(time.monotonic() - self.open.pop(connection))
        connection.close()


def healthy_client(address: str, body: bytes, seconds: float) -> dict[str, Any]:
    """Requests one after the other for ``seconds``: their statuses and latencies."""
    import httpx

    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    with httpx.Client(trust_env=False, timeout=10.0) as http:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            started = time.perf_counter()
            try:
                status = str(http.post(address + "/score", content=body).status_code)
            except httpx.HTTPError as err:
                status = type(err).__name__
            latencies.append(time.perf_counter() - started)
            statuses[status] += 1
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {
        "requests": len(latencies),
        "statuses": dict(statuses),
        "answered_within_1s": set(statuses) == {"200"} and ordered[-1] < HEALTHY_WITHIN_S,
        "latency_ms_p50": round(1000 * statistics.median(ordered), 1),
        "latency_ms_p99": round(1000 * p99, 1),
        "latency_ms_max": round(1000 * ordered[-1], 1),
    }


def level(address: str, body: bytes, slow: int, args: argparse.Namespace) -> dict[str, Any]:
    clients = SlowClients(address, slow, args.drip_s)
    clients.start()
    try:
        connected = len(clients.open)
        row = healthy_client(address, body, args.seconds)
    finally:
        clients.close()
    row.update(
        slow_clients=slow,
        slow_connected=connected,
        slow_replies={str(k): v for k, v in sorted(clients.replies.items())},
        slow_max_held_s=round(max(clients.held_s), 2) if clients.held_s else None,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="0,16,64,256", help="slow clients, in order")
    # Past the 10 s head timeout, so that every level sees the server close its slow clients.
    parser.add_argument("--seconds", type=float, default=11.0, help="healthy requests per level")
    parser.add_argument("--drip-s", type=float, default=1.0, help="between slow header lines")
    parser.add_argument("--images", type=int, default=4, help="images per healthy request")
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--batch-ms", type=float, default=5.0, help="sleep per reward call")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return
    levels = [int(k) for k in args.levels.split(",")]
    body = request_body(args.images, args.size)
    import httpx

    child, address = spawn_server(Path(__file__).resolve(), ["--batch-ms", str(args.batch_ms)])
    try:
        limits = httpx.get(address + "/health", timeout=30, trust_env=False).json()["limits"]
        healthy_client(address, body, 0.5)  # warm up: imports, first decode, first batch
        rows = [level(address, body, slow, args) for slow in levels]
    finally:
        child.terminate()
        child.wait(timeout=30)
    survived = None
    for row in rows:
        if not row["answered_within_1s"]:
            break
        survived = row["slow_clients"]
    print(
        f"{'slow':>6} {'open':>6} {'healthy':>8} {'ok<1s':>6} {'p99 ms':>8} {'max ms':>8}  replies"
    )
    for row in rows:
        print(
            f"{row['slow_clients']:>6} {row['slow_connected']:>6} {row['requests']:>8} "
            f"{row['answered_within_1s']!s:>6} {row['latency_ms_p99']:>8.1f} "
            f"{row['latency_ms_max']:>8.1f}  {row['slow_replies']} (healthy: {row['statuses']})"
        )
    summary = {
        "benchmark": "reward_server_slow_clients",
        "slow_clients_survived": survived,
        "healthy_p99_ms_at_survived": next(
            (r["latency_ms_p99"] for r in rows if r["slow_clients"] == survived), None
        ),
        "levels": {str(r["slow_clients"]): r for r in rows},
        "settings": {
            "levels": levels,
            "seconds_per_level": args.seconds,
            "drip_s": args.drip_s,
            "images_per_request": args.images,
            "image_size": args.size,
            "batch_ms": args.batch_ms,
            "header_timeout_s": limits["header_timeout_s"],  # the server's defaults
            "max_connections": limits["max_connections"],
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
