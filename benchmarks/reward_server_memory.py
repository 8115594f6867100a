"""Peak memory of a reward server decoding small-file, huge-canvas PNGs sent in parallel.

A solid 8000x8000 RGB PNG is a few hundred KB on the wire and 768 MB once decoded to float32, so
a handful of parallel requests can take a server's memory many times over. This script starts a
server in a child process (a reward that returns zeros, so the memory measured is the request
handling's, not a model's), sends ``--parallel`` such requests at once, retries 503s (as
``RemoteReward`` does, honouring Retry-After) within a bounded deadline, and reports the child's
peak resident memory (``VmHWM``) after a warm-up request and after the parallel ones.

    python benchmarks/reward_server_memory.py [--side 8000] [--parallel 4] [--server-kwargs JSON]

Linux only (reads ``/proc``). Ends with one JSON object on its last line (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SERVER = """
import json, sys, torch
from reward_models.base import RewardModel, RewardOutput
from reward_models.serving.server import RewardServer

class Zero(RewardModel):
    name = "zero"
    accepts = ("images",)

    def score(self, outputs, prompts, metadata):
        return RewardOutput({self.name: torch.zeros(len(prompts))})

server = RewardServer(Zero(), port=0, **json.loads(sys.argv[1]))
print(server.address, flush=True)
server.serve_forever()
"""


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


def png_b64(side: int) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (side, side), (200, 30, 30)).save(buffer, format="PNG", compress_level=9)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def post(url: str, body: bytes, deadline: float) -> tuple[int, int]:
    """(final status, attempts); 503s are retried until ``deadline``."""
    attempts = 0
    while True:
        attempts += 1
        request = urllib.request.Request(url + "/score", body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=max(1.0, deadline - time.time())):
                return 200, attempts
        except urllib.error.HTTPError as err:
            if err.code != 503 or time.time() > deadline:
                return err.code, attempts
            time.sleep(float(err.headers.get("Retry-After", "1")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=8000, help="image width and height")
    parser.add_argument("--parallel", type=int, default=4, help="requests sent at once")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds for all of them")
    parser.add_argument("--server-kwargs", default="{}", help="RewardServer arguments as JSON")
    args = parser.parse_args()

    child = subprocess.Popen(
        [sys.executable, "-c", SERVER, args.server_kwargs],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        deadline = time.time() + args.deadline
        small = {"version": 1, "prompts": ["p"], "outputs": {"images": [png_b64(8)]}}
        post(url, json.dumps(small).encode(), deadline)  # warm-up: imports, first batch
        idle_mb = peak_rss_mb(child.pid)
        item = png_b64(args.side)
        body = json.dumps({"version": 1, "prompts": ["p"], "outputs": {"images": [item]}})
        results: list[tuple[int, int]] = []
        started = time.time()
        threads = [
            threading.Thread(target=lambda: results.append(post(url, body.encode(), deadline)))
            for _ in range(args.parallel)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.time() - started
        peak_mb = peak_rss_mb(child.pid)
    finally:
        child.terminate()
        child.wait(timeout=30)
    statuses = sorted(status for status, _ in results)
    report = {
        "side": args.side,
        "png_kb": round(len(base64.b64decode(item)) / 1024, 1),
        "decoded_float32_mb": round(args.side**2 * 3 * 4 / 2**20, 1),
        "parallel": args.parallel,
        "server_kwargs": json.loads(args.server_kwargs),
        "statuses": statuses,
        "attempts": sum(attempts for _, attempts in results),
        "seconds": round(seconds, 1),
        "idle_peak_rss_mb": round(idle_mb, 1),
        "peak_rss_mb": round(peak_mb, 1),
    }
    for key, value in report.items():
        print(f"{key:>20}: {value}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
