"""Rubric reward cost: judge calls and seconds per sample for a 5-criterion rubric, with the
batch's judge items sent together (``batched``) against one item per call, on the test suite's
tiny random LLaVA (local forwards) and on a loopback OpenAI-compatible stub that answers after
``--latency-ms`` (requests, ``concurrency`` in flight).

The rubric: an essential criterion routed to an LLM extractor then the numeric verifier, two
text judge criteria, one judge criterion that needs the prompt's image, and a pitfall checked
by a regex verifier; so each sample costs one extraction and three judge questions.

    python benchmarks/rubric.py                      # 16 samples, 3 repeats
    python benchmarks/rubric.py --samples 4 --repeats 1

The last line is one JSON object (benchmarks/README.md): per back-end ``judge_calls`` and
``seconds_per_sample`` (batched and one by one) and ``batched_speedup``; the top-level
``batched_speedup`` is the local back-end's.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the tiny LLaVA builder

RUBRIC = [
    {"id": "answer", "text": "The final answer is right", "weight": 5, "category": "essential",
     "route": "extract", "extractor": "judge", "verifier": "numeric"},
    {"id": "clear", "text": "The response is clear", "weight": 3, "route": "judge"},
    {"id": "steps", "text": "The response shows its steps", "weight": 2, "route": "judge"},
    {"id": "image", "text": "The response describes the image", "weight": 1,
     "category": "optional", "route": "judge", "needs_image": True},
    {"id": "hedge", "text": "Hedges", "weight": 1, "category": "pitfall", "route": "verifier",
     "verifier": "regex", "verifier_kwargs": {"pattern": "(?i)maybe"}},
]  # fmt: skip


class SlowStub(BaseHTTPRequestHandler):
    """OpenAI-compatible chat stub: log-probs for one-token requests, "42" otherwise, each
    reply after ``latency_s``."""

    latency_s: ClassVar[float] = 0.02

    def log_message(self, *args: Any) -> None:
        del args

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(self.latency_s)
        if body.get("max_tokens") == 1:
            top = [
                {"token": "Yes", "logprob": math.log(0.3)},
                {"token": "No", "logprob": math.log(0.6)},
            ]
            choice: dict[str, Any] = {
                "logprobs": {"content": [{"token": "No", "top_logprobs": top}]}
            }
        else:
            choice = {"message": {"content": "42"}}
        data = json.dumps({"choices": [choice]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def batch(samples: int) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """Groups of four samples per prompt, with an image and an answer in the metadata."""
    g = torch.Generator().manual_seed(0)
    prompts = [f"question {i // 4}" for i in range(samples)]
    texts = [f"Step one. Step two. The answer is {40 + i % 4}." for i in range(samples)]
    meta = [{"answer": 42, "image": torch.rand(3, 32, 32, generator=g)} for _ in range(samples)]
    return texts, prompts, meta


def measure(judge: dict[str, Any], samples: int, repeats: int) -> dict[str, Any]:
    """Seconds per sample and judge calls, batched and one by one (median of ``repeats``)."""
    from reward_models import build_reward

    texts, prompts, meta = batch(samples)
    row: dict[str, Any] = {}
    results = {}
    for mode, batched in (("batched", True), ("one_by_one", False)):
        reward = build_reward("rubric", rubric=RUBRIC, judge=dict(judge), batched=batched)
        reward(texts[:1], prompts[:1], meta[:1])  # load the model, warm up
        times = []
        for _ in range(repeats):
            reward.judge.calls = 0
            start = time.perf_counter()
            results[mode] = reward(texts, prompts, meta).scores["rubric"]
            times.append(time.perf_counter() - start)
        row[f"judge_calls_{mode}"] = reward.judge.calls
        row[f"seconds_per_sample_{mode}"] = statistics.median(times) / samples
    row["max_score_difference"] = float((results["batched"] - results["one_by_one"]).abs().max())
    row["batched_speedup"] = (
        row["seconds_per_sample_one_by_one"] / row["seconds_per_sample_batched"]
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="local items per forward")
    parser.add_argument("--concurrency", type=int, default=8, help="endpoint requests in flight")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="the stub's reply delay")
    args = parser.parse_args()
    torch.manual_seed(0)
    from vision_tiny import build_llava

    summary: dict[str, Any] = {
        "benchmark": "rubric",
        "criteria": len(RUBRIC),
        "samples": args.samples,
    }
    with tempfile.TemporaryDirectory() as tmp:
        model = build_llava(Path(tmp))
        local = {"model": str(model), "batch_size": args.batch_size, "max_new_tokens": 4}
        summary["local"] = measure(local, args.samples, args.repeats)
    SlowStub.latency_s = args.latency_ms / 1000
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowStub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        endpoint = {"endpoint": url, "concurrency": args.concurrency}
        summary["endpoint"] = measure(endpoint, args.samples, args.repeats)
        summary["endpoint"]["latency_ms"] = args.latency_ms
    finally:
        server.shutdown()
    for name in ("local", "endpoint"):
        r = summary[name]
        print(
            f"{name:9s} calls {r['judge_calls_batched']:3d} vs {r['judge_calls_one_by_one']:3d}  "
            f"s/sample {r['seconds_per_sample_batched']:.4f} vs "
            f"{r['seconds_per_sample_one_by_one']:.4f}  speedup {r['batched_speedup']:.2f}x"
        )
    summary["batched_speedup"] = summary["local"]["batched_speedup"]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
