"""The reference policy exists only when a run uses it: no frozen copy of the network at
``kl_beta=0``, a copy of the initial weights (in their storage dtype) when a KL term or a
reference-anchored objective needs one, optionally kept on the CPU between uses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny import tiny_config

from genrl import Trainer
from genrl.reporting.metrics import read_metrics
from genrl.run.build import build_run


def _parameter_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def test_no_reference_copy_at_kl_beta_zero(tmp_path: Path) -> None:
    run = build_run(tiny_config(tmp_path, "algorithm.kl_beta=0.0"))
    policy = run.policy
    assert not policy.is_lora and not run.objective.uses_reference
    assert policy._frozen_reference is None and policy.reference_bytes == {}
    with pytest.raises(RuntimeError, match="keep_reference"), policy.reference():
        pass


def test_kl_keeps_one_frozen_copy_of_the_initial_weights(tmp_path: Path) -> None:
    run = build_run(tiny_config(tmp_path, "algorithm.kl_beta=0.04"))
    assert run.objective.uses_reference
    held = run.policy.reference_bytes
    assert held == {"cpu": _parameter_bytes(run.policy.network)}
    assert held["cpu"] > 0
    # A LoRA run switches the adapter off instead: no copy whatever kl_beta says.
    lora = build_run(tiny_config(tmp_path, "algorithm.kl_beta=0.04", "policy.lora_rank=4"))
    assert lora.objective.uses_reference and lora.policy.reference_bytes == {}


def test_reference_copy_keeps_the_storage_dtype(tmp_path: Path) -> None:
    """Adapters make trained weights float32 after ``setup_training``; the copy, made later,
    goes back to what the weights were stored as (no float32 reference of a bf16 model)."""
    run = build_run(tiny_config(tmp_path))
    policy = run.policy
    policy._frozen_reference = None
    policy._storage_dtypes = {n: torch.bfloat16 for n, _ in policy.network.named_parameters()}
    policy.keep_reference()
    assert policy._frozen_reference is not None
    assert {p.dtype for p in policy._frozen_reference.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in policy.network.parameters()} == {torch.float32}


def _kl_run(tmp_path: Path, offload: bool) -> tuple[Trainer, list[dict]]:
    sets = ["algorithm.kl_beta=0.04", f"policy.reference_offload={str(offload).lower()}"]
    trainer = Trainer(tiny_config(tmp_path, *sets), run_dir=tmp_path / f"offload_{offload}")
    trainer.train()
    rows = [r for r in read_metrics(trainer.run_dir / "metrics.jsonl") if "loss/kl_loss" in r]
    return trainer, rows


def test_kl_run_scores_against_the_initial_weights(tmp_path: Path) -> None:
    """Two full fine-tuning iterations with a KL term: the reference still gives the initial
    model's velocity, the KL is measured, and offloading the copy changes no number."""
    trainer, rows = _kl_run(tmp_path, offload=True)
    policy = trainer.policy
    assert policy._frozen_reference is not None
    assert all(p.device.type == "cpu" for p in policy._frozen_reference.parameters())
    base = Trainer(tiny_config(tmp_path), run_dir=tmp_path / "base").policy
    x, sigma = torch.randn(3, 1, 8, 8), torch.full((3,), 0.5)
    condition = policy.encode_prompts(["digit 1", "digit 2", "digit 3"])
    with torch.no_grad():
        with policy.reference():
            reference = policy.velocity(x, sigma, condition)
        trained = policy.velocity(x, sigma, condition)
        initial = base.velocity(x, sigma, condition)
    torch.testing.assert_close(reference, initial, rtol=0, atol=0)
    assert not torch.allclose(trained, initial)
    assert len(rows) == 2 and rows[1]["loss/kl_loss"] > 0

    _, resident = _kl_run(tmp_path, offload=False)
    keys = ("loss/total", "loss/kl_loss", "grad_norm")
    assert [[r[k] for k in keys] for r in rows] == [[r[k] for k in keys] for r in resident]
