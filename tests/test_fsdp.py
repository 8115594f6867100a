"""FSDP2 on CPU processes (gloo): two iterations of the tiny SD3 and the tiny Qwen3, full and
LoRA fine-tuning, match DDP (``genrl/distributed/sharding.py``; accelerate drops FSDP on CPU, so genrl
applies torch's ``fully_shard`` itself). Each launch runs both modes in one process group
(``tests/fsdp_worker.py``)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
# Sharding changes the order of floating-point reductions (reduce-scatter of gradient shards
# against DDP's all-reduce, the norm of shards for clipping): losses and weights agree to
# float32 rounding, far below the ~1e-3 an update moves a weight.
TOLERANCE = 1e-6


def launch(out: Path, model: str, lora: int, *extra: str) -> list[dict]:
    if model == "sd3":
        from diffusers_tiny import tiny_sd3_run

        tiny_sd3_run(out / "models")  # builds the pipeline and reward model once
    else:
        from test_causal_lm import save_tiny_lm

        save_tiny_lm(out / "models" / "lm")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", str(ROOT / "tests" / "fsdp_worker.py"), str(out), model,
               str(lora), *extra]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               HF_HUB_OFFLINE="1")  # fmt: skip
    env.pop("ACCELERATE_USE_FSDP", None)
    # A deadlocked collective would otherwise hang the suite: fail after 10 minutes instead.
    done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    assert done.returncode == 0, "\n".join(errors[:20]) + done.stderr[-3000:]
    name = extra[0] if extra else "rank"
    return [torch.load(out / f"{name}{r}.pt", weights_only=True) for r in range(2)]


def exported(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.rglob("*.safetensors")):
        prefix = str(file.relative_to(directory))
        tensors.update({f"{prefix}:{k}": v for k, v in load_file(file).items()})
    return tensors


@pytest.mark.slow
@pytest.mark.parametrize("lora", [0, 4])
@pytest.mark.parametrize("model", ["sd3", "qwen3"])
def test_fsdp2_matches_ddp(tmp_path: Path, model: str, lora: int) -> None:
    ranks = launch(tmp_path, model, lora)
    for result in ranks:
        ddp, fsdp = result["ddp"], result["fsdp"]
        assert fsdp["sharded"] and not ddp["sharded"]
        torch.testing.assert_close(fsdp["losses"], ddp["losses"], rtol=0, atol=TOLERANCE)
        torch.testing.assert_close(fsdp["grad_norms"], ddp["grad_norms"], rtol=1e-5, atol=0)
        assert fsdp["weights"].keys() == ddp["weights"].keys()
        moved = max(
            float((ddp["weights"][k] - ddp["initial"][k]).abs().max()) for k in ddp["weights"]
        )
        assert moved > 1e-4, "the weights must move for the comparison to mean anything"
        for name, value in ddp["weights"].items():
            torch.testing.assert_close(fsdp["weights"][name], value, rtol=0, atol=TOLERANCE)
            torch.testing.assert_close(fsdp["initial"][name], ddp["initial"][name], rtol=0, atol=0)
    # Both processes hold the same whole weights, and the main process exported them whole.
    for name, value in ranks[0]["fsdp"]["weights"].items():
        torch.testing.assert_close(ranks[1]["fsdp"]["weights"][name], value, rtol=0, atol=0)
    from_ddp, from_fsdp = exported(tmp_path / "export_ddp"), exported(tmp_path / "export_fsdp")
    assert from_ddp and from_fsdp.keys() == from_ddp.keys()
    for name, value in from_ddp.items():
        torch.testing.assert_close(from_fsdp[name], value, rtol=0, atol=TOLERANCE)


@pytest.mark.slow
def test_sharded_checkpoint_resumes_to_the_uninterrupted_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Full fine-tuning of the tiny SD3 under FSDP2: one iteration, a sharded checkpoint (each
    process writes its shard), a fresh Trainer resuming it for the second iteration ends at
    exactly the weights and losses of two uninterrupted iterations. The same checkpoint also
    resumes in this one unsharded process (``one_process_resumes_shards``)."""
    ranks = launch(tmp_path, "sd3", 0, "resume")
    one_process_resumes_shards(tmp_path, ranks[0], capsys)
    for result in ranks:
        assert result["shards"] == ["__0_0.distcp", "__1_0.distcp"]
        assert result["split_losses"] == result["whole_losses"]
        moved = max(
            float((result["whole"][k] - result["initial"][k]).abs().max()) for k in result["whole"]
        )
        assert moved > 1e-4
        for name, value in result["whole"].items():
            torch.testing.assert_close(result["resumed"][name], value, rtol=0, atol=0)


def one_process_resumes_shards(
    out: Path, written: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 2-process sharded checkpoint of iteration 1 loads into one unsharded process (torch
    distributed checkpointing reshards into whole tensors): exactly the weights and AdamW
    moments the FSDP2 run held, a one-line notice of the process count, and the continued
    iteration samples and scores exactly what the uninterrupted FSDP2 run did (same weights,
    same named random streams); only the update after it may differ (other minibatches)."""
    from fsdp_worker import config
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from genrl.loop.trainer import Trainer
    from genrl.reporting.metrics import read_metrics

    shutil.copytree(out / "split", out / "single")
    first = out / "single" / "checkpoints" / "iter_000001"
    trainer = Trainer(config(out, "sd3", 0), run_dir=out / "single", resume_from=first)
    assert not trainer.policy.sharded
    trainer.load_checkpoint(first)
    assert "written by 2 processes on 1" in capsys.readouterr().out
    for name, value in written["after_one"].items():
        torch.testing.assert_close(
            trainer.policy.trainable_state_dict()[name], value, rtol=0, atol=0
        )
    moments = get_optimizer_state_dict(trainer.policy.network, trainer.optimizer.optimizer)
    assert (
        written["after_one_optim"] and moments["state"].keys() == written["after_one_optim"].keys()
    )
    for name, saved in written["after_one_optim"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(moments["state"][name][key], saved[key], rtol=0, atol=0)
    assert trainer.iteration == 1
    trainer.train()
    resumed = read_metrics(out / "single" / "metrics.jsonl")
    uninterrupted = read_metrics(out / "whole" / "metrics.jsonl")
    # Iteration 2's training row (a resume drops the rows logged after its checkpoint).
    row = [r for r in resumed if r.get("iteration") == 2 and "loss/total" in r][-1]
    reference = [r for r in uninterrupted if r.get("iteration") == 2 and "loss/total" in r][-1]
    rewards = [k for k in reference if k.endswith("/mean") and k in row]
    assert rewards, sorted(reference)
    for key in rewards:
        assert row[key] == pytest.approx(reference[key], rel=0, abs=1e-6), key


@pytest.mark.slow
def test_ddp_checkpoint_resumes_a_sharded_run(tmp_path: Path) -> None:
    """One DDP iteration of the tiny SD3 (full fine-tuning), its unsharded checkpoint resumed
    by an FSDP2 run for the second: each process keeps its shard of the whole weights and AdamW
    moments, and the run ends at the weights of two DDP iterations to FSDP2's 1e-6 (the same
    minibatches; only reduction order differs)."""
    ranks = launch(tmp_path, "sd3", 0, "from_ddp")
    for result in ranks:
        assert result["sharded"]
        whole, split = result["whole_losses"], result["split_losses"]
        assert len(whole) == len(split) == 2 and split[0] == whole[0]
        assert split[1] == pytest.approx(whole[1], rel=0, abs=TOLERANCE)
        assert result["resumed"].keys() == result["whole"].keys()
        for name, value in result["whole"].items():
            torch.testing.assert_close(result["resumed"][name], value, rtol=0, atol=TOLERANCE)


@pytest.mark.slow
def test_ddp_evaluation_with_uneven_chunks_finishes(tmp_path: Path) -> None:
    """At every evaluation of ``train()`` under DDP one process makes the only held-out chunk;
    both processes finish and report the same held-out rewards
    (``evaluation.without_ddp_wrapper``)."""
    ranks = launch(tmp_path, "sd3", 4, "ddp_eval")
    assert ranks[0]["rewards"] == ranks[1]["rewards"]
    assert all(math.isfinite(r) for r in ranks[0]["rewards"])
