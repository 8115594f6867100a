"""Throughput of the reward server's ASGI front (Starlette on uvicorn) against the legacy
http.server front, in one run, on loopback.

Each front serves the same deterministic image reward (a fixed sleep per reward call, standing
in for a model forward that releases the GIL, then the mean pixel) in its own child process,
with the same limits and batching (``max_batch_size``, ``batch_wait_s``). For each number of
concurrent clients (1, 8, 32 by default), every client, a thread with its own keep-alive httpx
connection, sends ``--requests`` requests of ``--images`` PNG images one after the other (the
body encoded once, as a trainer rank would send it) and checks each reply holds one score per
image. Fronts alternate within every repeat; requests/s and images/s are the medians over
repeats. The headline ``throughput_ratio`` is new/legacy requests/s at the highest concurrency;
``throughput_ratio_by_concurrency`` gives the others.

    python benchmarks/reward_server.py [--concurrency 1,8,32] [--requests 16] [--repeats 3]

Ends with one JSON object on its last line (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FRONTS = ("stdlib", "asgi")  # legacy baseline first


def serve(args: argparse.Namespace) -> None:
    """Child process: serve the sleep reward with ``args.serve`` as front until killed."""
    import torch

    from reward_models.base import RewardModel, RewardOutput
    from reward_models.serving.server import RewardServer

    torch.set_num_threads(1)

    class SleepReward(RewardModel):
        """The mean pixel of each image after ``batch_ms`` of sleep per call."""

        name = "sleep"
        accepts = ("images",)

        def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
            time.sleep(args.batch_ms / 1000)
            return RewardOutput({self.name: outputs.mean(dim=(1, 2, 3))})

    rewards = [SleepReward() for _ in range(args.replicas)]
    server = RewardServer(
        rewards, port=0, front=args.serve, max_batch_size=args.max_batch_size, batch_wait_s=0.01
    )
    print(server.address, flush=True)
    server.serve_forever()


def start_server(front: str, args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, str(Path(__file__).resolve()), "--serve", front]
    command += ["--batch-ms", str(args.batch_ms), "--replicas", str(args.replicas)]
    command += ["--max-batch-size", str(args.max_batch_size)]
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    address = child.stdout.readline().strip()
    if not address.startswith("http://"):
        child.kill()
        raise RuntimeError(f"the {front} server did not start (said {address!r})")
    return child, address


def request_body(images: int, size: int) -> bytes:
    import torch

    from reward_models.wire import encode_outputs

    batch = torch.rand(images, 3, size, size, generator=torch.Generator().manual_seed(0))
    payload = {"version": 1, "prompts": ["p"] * images, "outputs": encode_outputs(batch)}
    return json.dumps(payload).encode()


def measure(address: str, body: bytes, clients: int, args: argparse.Namespace) -> dict[str, Any]:
    """``clients`` threads x ``args.requests`` sequential requests; wall time of them all."""
    import httpx

    latencies: list[float] = []
    errors: list[str] = []
    first: list[list[float]] = []
    ready = threading.Barrier(clients + 1)

    def client() -> None:
        with httpx.Client(trust_env=False, timeout=args.timeout) as http:
            http.get(address + "/health")  # connect before the clock starts
            ready.wait()
            for _ in range(args.requests):
                started = time.perf_counter()
                try:
                    reply = http.post(address + "/score", content=body)
                    scores = reply.json()["scores"]["sleep"]
                except Exception as err:  # counted, reported, fails the run
                    errors.append(repr(err))
                    continue
                latencies.append(time.perf_counter() - started)
                if reply.status_code != 200 or len(scores) != args.images:
                    errors.append(f"HTTP {reply.status_code}, {len(scores)} scores")
                elif not first:
                    first.append(scores)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join(timeout=args.timeout * args.requests)
    seconds = time.perf_counter() - started
    if errors or any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"{address}: {len(errors)} failed requests, e.g. {errors[:3]}")
    done = clients * args.requests
    return {
        "requests_per_s": done / seconds,
        "images_per_s": done * args.images / seconds,
        "latency_ms_median": 1000 * statistics.median(latencies),
        "scores": first[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    parser.add_argument("--requests", type=int, default=16, help="requests per client")
    parser.add_argument("--images", type=int, default=4, help="images per request")
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--batch-ms", type=float, default=20.0, help="sleep per reward call")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--replicas", type=int, default=1, help="model replicas per server")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    parser.add_argument("--serve", choices=FRONTS, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return
    levels = [int(c) for c in args.concurrency.split(",")]
    body = request_body(args.images, args.size)
    servers = {front: start_server(front, args) for front in FRONTS}
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {f: {c: [] for c in levels} for f in FRONTS}
    try:
        for front in FRONTS:  # warm-up: imports, first decode, first batch
            measure(servers[front][1], body, 2, argparse.Namespace(**{**vars(args), "requests": 2}))
        for repeat in range(args.repeats):
            for clients in levels:
                order = FRONTS if repeat % 2 == 0 else FRONTS[::-1]
                for front in order:
                    runs[front][clients].append(measure(servers[front][1], body, clients, args))
    finally:
        for child, _ in servers.values():
            child.terminate()
            child.wait(timeout=30)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for front in FRONTS:
        table[front] = {}
        for clients in levels:
            rows = runs[front][clients]
            table[front][str(clients)] = {
                key: round(statistics.median(r[key] for r in rows), 2)
                for key in ("requests_per_s", "images_per_s", "latency_ms_median")
            }
    ratios = {
        str(c): round(
            table["asgi"][str(c)]["requests_per_s"] / table["stdlib"][str(c)]["requests_per_s"], 3
        )
        for c in levels
    }
    same = runs["asgi"][levels[0]][0]["scores"] == runs["stdlib"][levels[0]][0]["scores"]
    print(f"{'front':>8} {'clients':>8} {'requests/s':>11} {'images/s':>10} {'median ms':>10}")
    for front in FRONTS:
        for clients in levels:
            row = table[front][str(clients)]
            print(
                f"{front:>8} {clients:>8} {row['requests_per_s']:>11.1f} "
                f"{row['images_per_s']:>10.1f} {row['latency_ms_median']:>10.1f}"
            )
    print(
        "new (asgi) / legacy (stdlib) requests/s: "
        + ", ".join(f"{c}: {r}" for c, r in ratios.items())
    )
    summary = {
        "benchmark": "reward_server",
        "throughput_ratio": ratios[str(max(levels))],
        "throughput_ratio_by_concurrency": ratios,
        "new": table["asgi"],
        "legacy": table["stdlib"],
        "scores_equal": same,
        "settings": {
            "concurrency": levels,
            "requests_per_client": args.requests,
            "images_per_request": args.images,
            "image_size": args.size,
            "batch_ms": args.batch_ms,
            "max_batch_size": args.max_batch_size,
            "replicas": args.replicas,
            "repeats": args.repeats,
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
