"""FSDP2 on CPU processes (gloo): two iterations of the tiny SD3 and the tiny Qwen3, full and
LoRA fine-tuning, match DDP (``genrl/sharding.py``; accelerate drops FSDP on CPU, so genrl
applies torch's ``fully_shard`` itself). Each launch runs both modes in one process group
(``tests/fsdp_worker.py``)."""

from __future__ import annotations

import os
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
    done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True)
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    assert done.returncode == 0, "\n".join(errors[:20]) + done.stderr[-3000:]
    name = "resume" if extra else "rank"
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
def test_sharded_checkpoint_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    """Full fine-tuning of the tiny SD3 under FSDP2: one iteration, a sharded checkpoint (each
    process writes its shard), a fresh Trainer resuming it for the second iteration ends at
    exactly the weights and losses of two uninterrupted iterations."""
    ranks = launch(tmp_path, "sd3", 0, "resume")
    for result in ranks:
        assert result["shards"] == ["__0_0.distcp", "__1_0.distcp"]
        assert result["split_losses"] == result["whole_losses"]
        moved = max(
            float((result["whole"][k] - result["initial"][k]).abs().max()) for k in result["whole"]
        )
        assert moved > 1e-4
        for name, value in result["whole"].items():
            torch.testing.assert_close(result["resumed"][name], value, rtol=0, atol=0)
