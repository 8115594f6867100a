"""Throughput of the reward server against scoring in process, in one run, on loopback.

The reward is deterministic: a fixed sleep per call, standing in for a model forward that
releases the GIL, then the mean pixel. Served, it runs in a child process behind the server's
HTTP front (Starlette on uvicorn) with ``max_batch_size`` and a 10 ms merge wait; for each
number of concurrent clients (1, 8, 32 by default), every client, a thread with its own
keep-alive httpx connection, sends ``--requests`` requests of ``--images`` PNG images one after
the other (the body encoded once) and checks each reply holds one score per image. The baseline
is the same reward in this process shared by the same client threads, one call per request
(one model instance, as a single server replica: calls take a lock), on the images the PNGs
decode to. Served and in-process runs alternate within every repeat; requests/s and images/s
are the medians over repeats. The headline ``throughput_ratio`` is served/in-process requests/s
at the highest concurrency (above 1: merging requests into one call gains more than HTTP and
PNG decoding cost); ``throughput_ratio_by_concurrency`` gives the others.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WAYS = ("in_process", "served")  # baseline first


def sleep_reward(batch_ms: float) -> Any:
    """The benchmark's reward: ``batch_ms`` of sleep per call, then each image's mean pixel."""
    from reward_models.base import RewardModel, RewardOutput

    class SleepReward(RewardModel):
        name = "sleep"
        accepts = ("images",)

        def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
            time.sleep(batch_ms / 1000)
            return RewardOutput({self.name: outputs.mean(dim=(1, 2, 3))})

    return SleepReward()


def serve(args: argparse.Namespace) -> None:
    """Child process: serve the sleep reward until killed."""
    import torch

    from reward_models.serving.server import RewardServer

    torch.set_num_threads(1)
    rewards = [sleep_reward(args.batch_ms) for _ in range(args.replicas)]
    server = RewardServer(rewards, port=0, max_batch_size=args.max_batch_size, batch_wait_s=0.01)
    print(server.address, flush=True)
    server.serve_forever()


def spawn_server(script: Path, options: list[str]) -> tuple[subprocess.Popen[str], str]:
    """Run ``script --serve OPTIONS`` (a benchmark's own child mode) and wait for the address
    it prints; returns the child process and that address."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, str(script), "--serve", *options]
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    address = child.stdout.readline().strip()
    if not address.startswith("http://"):
        child.kill()
        raise RuntimeError(f"the reward server did not start (said {address!r})")
    return child, address


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    options = ["--batch-ms", str(args.batch_ms), "--replicas", str(args.replicas)]
    options += ["--max-batch-size", str(args.max_batch_size)]
    return spawn_server(Path(__file__).resolve(), options)


def request_body(images: int, size: int) -> bytes:
    import torch

    from reward_models.wire import encode_outputs

    batch = torch.rand(images, 3, size, size, generator=torch.Generator().manual_seed(0))
    payload = {"version": 1, "prompts": ["p"] * images, "outputs": encode_outputs(batch)}
    return json.dumps(payload).encode()


def over_http(address: str, body: bytes, args: argparse.Namespace) -> Callable[[], Any]:
    """A client's connection to the server: a call sends one request, returns its scores."""
    import httpx

    http = httpx.Client(trust_env=False, timeout=args.timeout)
    http.get(address + "/health")  # connect before the clock starts

    def send() -> list[float]:
        reply = http.post(address + "/score", content=body)
        if reply.status_code != 200:
            raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:200]}")
        return reply.json()["scores"]["sleep"]

    return send


def in_process(reward: Any, images: Any, lock: threading.Lock) -> Callable[[], Any]:
    """A client of the shared in-process reward: a call scores one request's images."""

    def send() -> list[float]:
        with lock:  # one model instance: one call at a time
            return reward(images, ["p"] * len(images)).scores["sleep"].tolist()

    return send


def measure(connect: Callable[[], Callable[[], Any]], clients: int, args) -> dict[str, Any]:
    """``clients`` threads x ``args.requests`` sequential requests; wall time of them all."""
    latencies: list[float] = []
    errors: list[str] = []
    first: list[list[float]] = []
    ready = threading.Barrier(clients + 1)

    def client() -> None:
        send = connect()
        ready.wait()
        for _ in range(args.requests):
            started = time.perf_counter()
            try:
                scores = send()
            except Exception as err:  # counted, reported, fails the run
                errors.append(repr(err))
                continue
            latencies.append(time.perf_counter() - started)
            if len(scores) != args.images:
                errors.append(f"{len(scores)} scores for {args.images} images")
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
        raise RuntimeError(f"{len(errors)} failed requests, e.g. {errors[:3]}")
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
    parser.add_argument("--replicas", type=int, default=1, help="model replicas of the server")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return
    import torch

    from reward_models.wire import decode_outputs

    torch.set_num_threads(1)  # as the server's child process
    levels = [int(c) for c in args.concurrency.split(",")]
    body = request_body(args.images, args.size)
    decoded = decode_outputs(json.loads(body)["outputs"])
    reward, lock = sleep_reward(args.batch_ms), threading.Lock()
    child, address = start_server(args)
    connect = {
        "served": lambda: over_http(address, body, args),
        "in_process": lambda: in_process(reward, decoded, lock),
    }
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {w: {c: [] for c in levels} for w in WAYS}
    try:
        warm_up = argparse.Namespace(**{**vars(args), "requests": 2})
        for way in WAYS:  # imports, first decode, first batch
            measure(connect[way], 2, warm_up)
        for repeat in range(args.repeats):
            for clients in levels:
                for way in WAYS if repeat % 2 == 0 else WAYS[::-1]:
                    runs[way][clients].append(measure(connect[way], clients, args))
    finally:
        child.terminate()
        child.wait(timeout=30)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for way in WAYS:
        table[way] = {}
        for clients in levels:
            rows = runs[way][clients]
            table[way][str(clients)] = {
                key: round(statistics.median(r[key] for r in rows), 2)
                for key in ("requests_per_s", "images_per_s", "latency_ms_median")
            }
    ratios = {
        str(c): round(
            table["served"][str(c)]["requests_per_s"]
            / table["in_process"][str(c)]["requests_per_s"],
            3,
        )
        for c in levels
    }
    same = runs["served"][levels[0]][0]["scores"] == runs["in_process"][levels[0]][0]["scores"]
    print(f"{'scoring':>10} {'clients':>8} {'requests/s':>11} {'images/s':>10} {'median ms':>10}")
    for way in WAYS:
        for clients in levels:
            row = table[way][str(clients)]
            print(
                f"{way:>10} {clients:>8} {row['requests_per_s']:>11.1f} "
                f"{row['images_per_s']:>10.1f} {row['latency_ms_median']:>10.1f}"
            )
    print("served / in-process requests/s: " + ", ".join(f"{c}: {r}" for c, r in ratios.items()))
    summary = {
        "benchmark": "reward_server",
        "throughput_ratio": ratios[str(max(levels))],
        "throughput_ratio_by_concurrency": ratios,
        "served": table["served"],
        "in_process": table["in_process"],
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
