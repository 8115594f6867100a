"""Two "nodes" on this machine (two torchrun launchers with ``--nnodes 2`` on loopback, one
process each) train the same run as one node with two processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_multiprocess import ROOT, _sets

from genrl.reporting.metrics import read_metrics


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _train(tmp_path: Path, run: Path, launcher: list[str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "torch.distributed.run", *launcher, "-m", "genrl.cli.main",
               "train", "--output-dir", str(run), *_sets(tmp_path, "train.iterations=2")]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _finish(process: subprocess.Popen[str]) -> None:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-4000:]


@pytest.mark.slow
def test_two_nodes_on_loopback_match_one_node(tmp_path: Path) -> None:
    port = _free_port()
    nodes = []
    for rank in (0, 1):
        rendezvous = ["--nnodes", "2", "--node_rank", str(rank), "--nproc_per_node", "1",
                      "--master_addr", "127.0.0.1", "--master_port", str(port)]  # fmt: skip
        nodes.append(_train(tmp_path, tmp_path / "nodes", rendezvous))
    for process in nodes:
        _finish(process)
    _finish(_train(tmp_path, tmp_path / "one", ["--standalone", "--nproc_per_node", "2"]))
    two_nodes = read_metrics(tmp_path / "nodes" / "metrics.jsonl")
    one_node = read_metrics(tmp_path / "one" / "metrics.jsonl")
    assert [r["iteration"] for r in two_nodes] == [0, 1, 2, 2]
    keys = ("eval/reward", "digit_classifier/mean", "loss/total", "grad_norm")
    for a, b in zip(two_nodes, one_node, strict=True):
        for key in keys:
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=0, abs=1e-6), key
