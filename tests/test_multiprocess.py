"""A launcher's processes train one run together, on GPUs and on a CPU-only machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny import tiny_config, tiny_overrides

from genrl import Trainer
from genrl.reporting.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def _sets(tmp_path: Path, *extra: str) -> list[str]:
    return [arg for value in (*tiny_overrides(tmp_path), *extra) for arg in ("--set", value)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [(), ("train.overlap_rewards=true", "train.rollout_batch_size=3")],
    ids=["serial", "overlapped_rewards"],
)
def test_torchrun_on_cpu_trains_one_run_with_two_processes(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    """README's multi-process command on a machine without GPUs: both processes join one gloo
    group (before the fix each trained alone and metrics.jsonl held every row twice). With
    rewards overlapping sampling, each process scores its chunks and the scores are gathered
    after the last one, as in the serial order."""
    run = tmp_path / "run"
    sets = _sets(tmp_path, "train.iterations=2", *extra)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "genrl.cli.main", "train", "--output-dir", str(run),
               *sets]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    started = time.perf_counter()
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = read_metrics(run / "metrics.jsonl")
    assert [row["iteration"] for row in rows] == [0, 1, 2, 2]
    assert json.loads((run / "summary.json").read_text())["num_processes"] == 2
    # Two processes draw the same prompts, noise and rewards as one: the held-out reward before
    # training and the first iteration's rewards equal a one-process run's.
    single = Trainer(tiny_config(tmp_path), run_dir=tmp_path / "single")
    single.train(stop_after=1)
    alone = read_metrics(tmp_path / "single" / "metrics.jsonl")
    assert rows[0]["eval/reward"] == pytest.approx(alone[0]["eval/reward"], abs=1e-6)
    key = "digit_classifier/mean"
    assert rows[1][key] == pytest.approx(alone[1][key], abs=1e-6)
    print(f"2-process torchrun run: {seconds:.1f} s")
