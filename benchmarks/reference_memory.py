"""Memory of the reference policy under full fine-tuning, on the tiny random SD3 pipeline.

Before issue 17, full fine-tuning deep-copied the network as the KL reference whatever the
algorithm did with it (a second 12B copy per process for FLUX at ``kl_beta=0``). Now the copy is
made only when the rollout or the objective uses the reference, and ``policy.reference_offload``
keeps it on the CPU between uses. Three runs are built with ``genrl.run.build.build_run`` from the
``sd35m_pickscore`` recipe on ``tests/diffusers_tiny.build_sd3`` (``policy.lora_rank=0``):

* ``kl0``: ``kl_beta=0`` (no copy);
* ``kl`` : ``kl_beta=0.04``, the copy on the training device (what every full fine-tuning run
  held before, at any ``kl_beta``);
* ``kl_offload``: ``kl_beta=0.04`` with ``policy.reference_offload=true``.

For each: bytes of the trained transformer's parameters, bytes of the reference copy by device,
and the parameter bytes held on the training device (transformer + resident copy). On CUDA also
``torch.cuda.max_memory_allocated`` after building the run and one training iteration.

Usage::

    python benchmarks/reference_memory.py [--device cuda]

The last line is one JSON object; ``device_bytes_kl0_over_before`` is the kl0 run's device
parameter bytes over the pre-issue-17 layout (transformer + copy), 0.5 when nothing else counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from flow_pipes import quiet_libraries

SETTINGS = {
    "kl0": ["algorithm.kl_beta=0.0"],
    "kl": ["algorithm.kl_beta=0.04"],
    "kl_offload": ["algorithm.kl_beta=0.04", "policy.reference_offload=true"],
}


def measure(directory: Path, overrides: list[str], device: str, iterate: bool) -> dict[str, Any]:
    """Build one run (and train one iteration when ``iterate``); its parameter bytes."""
    from diffusers_tiny import tiny_sd3_run

    from genrl.loop.trainer import Trainer

    config = tiny_sd3_run(
        directory,
        "policy.lora_rank=0",
        "train.prompts_per_iteration=2",
        "train.group_size=2",
        "train.minibatch_size=4",
        "sampler.num_steps=3",
        "sampler.eval_num_steps=3",
        f"output_dir={directory / 'run'}",
        *overrides,
    )
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(config, overwrite=True)
    policy = trainer.policy
    network = sum(p.numel() * p.element_size() for p in policy.network.parameters())
    reference = policy.reference_bytes
    on_device = network + reference.get(policy.device.type, 0)
    row: dict[str, Any] = {
        "network_bytes": network,
        "reference_bytes": reference,
        "device_parameter_bytes": on_device,
    }
    if iterate:
        trainer.train_iteration()
    if device == "cuda":
        row["cuda_peak_bytes"] = torch.cuda.max_memory_allocated()
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--no-iteration", action="store_true", help="build only, do not train")
    args = parser.parse_args(argv)
    quiet_libraries()
    if args.device == "cpu":
        import os

        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    rows = {}
    with tempfile.TemporaryDirectory(prefix="genrl-bench-") as tmp:
        for name, overrides in SETTINGS.items():
            rows[name] = measure(Path(tmp), overrides, args.device, not args.no_iteration)
    print(f"{'run':<11} {'network MB':>11} {'reference MB':>24} {'device MB':>10}")
    for name, row in rows.items():
        ref = ", ".join(f"{k} {v / 1e6:.2f}" for k, v in row["reference_bytes"].items()) or "-"
        print(
            f"{name:<11} {row['network_bytes'] / 1e6:>11.2f} {ref:>24} "
            f"{row['device_parameter_bytes'] / 1e6:>10.2f}"
        )
    before = rows["kl"]["device_parameter_bytes"]  # every full fine-tuning run before
    summary = {
        "benchmark": "reference_memory",
        "device": args.device,
        "runs": rows,
        "device_bytes_kl0_over_before": rows["kl0"]["device_parameter_bytes"] / before,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
