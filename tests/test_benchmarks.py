"""Smoke runs of the benchmark scripts at tiny settings: they run to the end and their last line
of output is the JSON object with the keys the issues track."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(name: str, *args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "benchmarks"), *filter(None, [env.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_video_overhead_quick_ends_with_its_json_line() -> None:
    summary = run_benchmark(
        "video_overhead.py",
        "--quick",
        "--profile",
        *("--steps", "2", "--batch", "2", "--group-size", "2", "--frames", "1"),
        *("--height", "32", "--width", "32", "--max-sequence-length", "16"),
        *("--repeats", "1", "--warmup", "0", "--decode-repeats", "1", "--decode-chunk", "1"),
        *("--memory-frames", "5", "--lora-rank", "4", "--lora-alpha", "8"),
    )
    assert summary["benchmark"] == "video_overhead"
    assert summary["rollout_over_pipe_time_ratio"] > 0
    assert summary["target_ratio"] == 1.1
    assert set(summary["phases_ms"]) == {"ours", "pipe"}
    assert summary["decode_max_abs_difference"] < 1e-4  # our decode is the pipeline's
    memory = summary["peak_memory_mb_by_frames"]
    if sys.platform == "linux":
        assert set(memory) == {"5"}
        for row in memory.values():
            assert {"rollout", "decode", "pipe_rollout", "pipe_decode"} <= set(row)
            assert all(value >= 0 for value in row.values())
    assert summary["latent_shape"] == [4, 1, 4, 4]


@pytest.mark.slow
def test_rubric_benchmark_ends_with_its_json_line() -> None:
    summary = run_benchmark("rubric.py", "--samples", "2", "--repeats", "1", "--latency-ms", "1")
    assert summary["benchmark"] == "rubric" and summary["criteria"] == 5
    assert summary["batched_speedup"] > 0
    for backend in ("local", "endpoint"):
        row = summary[backend]
        # Two samples: 2 extractions + 6 judge questions one by one.
        assert row["judge_calls_one_by_one"] == 8 and row["max_score_difference"] < 1e-5
    assert summary["local"]["judge_calls_batched"] == 3  # extraction, text judges, image judge


@pytest.mark.slow
def test_reference_memory_ends_with_its_json_line() -> None:
    summary = run_benchmark("reference_memory.py", "--no-iteration")
    assert summary["benchmark"] == "reference_memory"
    runs = summary["runs"]
    assert runs["kl0"]["reference_bytes"] == {}  # no frozen copy at kl_beta=0
    assert runs["kl"]["reference_bytes"] == {"cpu": runs["kl"]["network_bytes"]}
    assert summary["device_bytes_kl0_over_before"] == 0.5


@pytest.mark.slow
def test_reward_overlap_quick_ends_with_its_json_line() -> None:
    summary = run_benchmark("reward_overlap.py", "--quick", "--seconds-per-image", "0.01")
    assert summary["benchmark"] == "reward_overlap"
    # 4 samples in chunks of 1: the last chunk's scoring is never hidden.
    assert summary["chunks"] == 4 and summary["max_hidden_fraction"] == 0.75
    assert summary["reward_s_per_image"] == 0.01
    assert summary["reward_s_per_iteration"] >= 0.04  # four images of 10 ms each
    assert summary["serial_iteration_s"] > 0 and summary["overlapped_iteration_s"] > 0
    assert summary["target_hidden_fraction"] == 0.8


def test_cli_startup_ends_with_its_json_line() -> None:
    summary = run_benchmark("cli_startup.py", "--repeats", "1")
    assert summary["benchmark"] == "cli_startup" and summary["repeats"] == 1
    assert summary["help_seconds"] > 0 and summary["python_seconds"] > 0
    ratio = summary["help_seconds"] / summary["python_seconds"]
    assert abs(summary["help_over_python_ratio"] - ratio) < 0.01


def test_reward_server_benchmark_ends_with_its_json_line() -> None:
    summary = run_benchmark(
        "reward_server.py",
        *("--concurrency", "1,2", "--requests", "2", "--repeats", "1", "--images", "2"),
        *("--size", "8", "--batch-ms", "1"),
    )
    assert summary["benchmark"] == "reward_server" and summary["scores_equal"] is True
    ratios = summary["throughput_ratio_by_concurrency"]
    assert set(ratios) == {"1", "2"} and summary["throughput_ratio"] == ratios["2"] > 0
    for front in ("new", "legacy"):
        for row in summary[front].values():  # 2 images per request
            assert row["images_per_s"] == pytest.approx(2 * row["requests_per_s"], rel=0.01)
