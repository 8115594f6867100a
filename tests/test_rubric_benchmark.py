"""Smoke run of ``benchmarks/rubric.py`` at tiny settings: it runs to the end and its last line
is the JSON object with ``batched_speedup`` (kept apart from ``tests/test_benchmarks.py``, which
lives on another branch, to keep the branches free of an add/add conflict)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_rubric_benchmark_ends_with_its_json_line() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "rubric.py"), "--samples", "2", "--repeats", "1",
         "--latency-ms", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "rubric" and summary["criteria"] == 5
    assert summary["batched_speedup"] > 0
    for backend in ("local", "endpoint"):
        row = summary[backend]
        # Two samples: 2 extractions + 6 judge questions one by one.
        assert row["judge_calls_one_by_one"] == 8 and row["max_score_difference"] < 1e-5
    assert summary["local"]["judge_calls_batched"] == 3  # extraction, text judges, image judge
