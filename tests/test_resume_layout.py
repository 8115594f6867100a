"""A DDP checkpoint resumes on another process count (``genrl/checkpoints/resume_layout.py``): written by 2
processes and continued by 1, and written by 1 and continued by 2.

What holds, measured on the tiny digits run: the continued iteration draws the same prompts and
noise from the restored weights and named random streams, so its rewards equal the
uninterrupted run's to 1e-6 (float32 batch-size rounding); its update does not (each process
shuffles its own share into minibatches), so nothing after the update is compared."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_multiprocess import ROOT, _sets
from tiny import tiny_config

from genrl import Trainer
from genrl.checkpoints.resume_layout import layout_notice
from genrl.reporting.metrics import read_metrics

EXTRA = ("train.iterations=2", "logging.checkpoint_every=1")
REWARD = "digit_classifier/mean"


def _torchrun(tmp_path: Path, *args: str) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "genrl.cli.main", "train", *args]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.pop("ACCELERATE_USE_FSDP", None)
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _second_iteration(run: Path) -> dict:
    """The training row of iteration 2 (a resume drops the rows logged after its checkpoint)."""
    return [r for r in read_metrics(run / "metrics.jsonl") if r["iteration"] == 2 and REWARD in r][
        -1
    ]


def _resumable_copy(run: Path, copy: Path) -> Path:
    shutil.copytree(run, copy)
    return copy / "checkpoints" / "iter_000001"


@pytest.mark.slow
def test_ddp_checkpoint_resumes_on_another_process_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2 -> 1: a 2-process run's checkpoint of iteration 1, continued in this process.
    _torchrun(tmp_path, "--output-dir", str(tmp_path / "two"), *_sets(tmp_path, *EXTRA))
    first = _resumable_copy(tmp_path / "two", tmp_path / "two_then_one")
    resumed = Trainer(tiny_config(tmp_path, *EXTRA), run_dir=first.parent.parent, resume_from=first)
    resumed.train()
    assert "checkpoint written by 2 processes on 1" in capsys.readouterr().out
    assert resumed.iteration == 2
    continued, uninterrupted = (
        _second_iteration(first.parent.parent),
        _second_iteration(tmp_path / "two"),
    )
    assert continued[REWARD] == pytest.approx(uninterrupted[REWARD], rel=0, abs=1e-6)
    loss_gap = abs(continued["loss/total"] - uninterrupted["loss/total"])
    print(f"2 -> 1: iteration-2 loss differs from the 2-process run's by {loss_gap:.3g}")

    # 1 -> 2: this process's checkpoint of iteration 1, continued by 2 processes.
    single = Trainer(tiny_config(tmp_path, *EXTRA), run_dir=tmp_path / "one")
    single.train()
    first = _resumable_copy(tmp_path / "one", tmp_path / "one_then_two")
    output = _torchrun(tmp_path, "--resume", str(first))
    assert "checkpoint written by 1 process on 2" in output
    continued, uninterrupted = (
        _second_iteration(first.parent.parent),
        _second_iteration(tmp_path / "one"),
    )
    assert continued[REWARD] == pytest.approx(uninterrupted[REWARD], rel=0, abs=1e-6)
    loss_gap = abs(continued["loss/total"] - uninterrupted["loss/total"])
    print(f"1 -> 2: iteration-2 loss differs from the 1-process run's by {loss_gap:.3g}")
    # The first iterations' rewards differ from the second's: the comparison can fail.
    assert _second_iteration(tmp_path / "one")[REWARD] != pytest.approx(
        read_metrics(tmp_path / "one" / "metrics.jsonl")[1][REWARD], abs=1e-6
    )


def test_layout_notice_names_both_counts_only_when_they_differ() -> None:
    assert layout_notice({"num_processes": 2}, 2, False) is None
    assert layout_notice({}, 4, False) is None  # written before the count was recorded
    line = layout_notice({"num_processes": 4}, 2, True)
    assert line is not None and "sharded (FSDP2) checkpoint written by 4 processes on 2" in line
    assert "\n" not in line
