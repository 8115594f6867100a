"""The run's own plan next to what it measured (``logging.plan``).

When a run starts, ``genrl plan``'s row for the run's setup (its strategy on its process count,
LoRA or full, gradient checkpointing on or off) goes to ``<run>/plan.json``, so the estimate is
there even when the run later fails; at its end ``measured`` adds the peak memory the CUDA
allocator saw on the main process and its ratio to the plan, for ``summary.json`` and
``report.html``. A CPU run has no allocator statistics, and says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from genrl.config.errors import ConfigError
from genrl.data.fileio import naming_full_disk
from genrl.distributed.deepspeed import uses_deepspeed, zero_stage
from genrl.distributed.sharding import env_requests_fsdp

PLAN_FILE = "plan.json"
NOMINAL_GPU_MEMORY = 80 * 2**30  # a CPU run is planned for 80 GiB GPUs ("fits" assumes them)


def run_strategy(accelerator: Any) -> str:
    """The planner's name for how this run is launched: ``1 GPU``, ``DDP``, ``FSDP2`` (reshard
    after forward), ``FSDP2-SGO`` (keep the gathered parameters) or ``ZeRO-2`` / ``ZeRO-3``."""
    if accelerator.num_processes == 1:
        return "1 GPU"
    if uses_deepspeed(accelerator):
        stage = zero_stage(accelerator)
        if stage not in (2, 3):
            raise ConfigError(f"logging.plan: the planner models ZeRO-2 and -3, not ZeRO-{stage}")
        return f"ZeRO-{stage}"
    if env_requests_fsdp():
        plugin = getattr(accelerator.state, "fsdp_plugin", None)
        reshard = getattr(plugin, "reshard_after_forward", None)
        if reshard is None:  # genrl's own FSDP2 on CPU processes reads the launch's variable
            reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true")
        keeps = reshard is False or str(reshard).lower() in ("false", "shard_grad_op")
        return "FSDP2-SGO" if keeps else "FSDP2"
    return "DDP"


def _plannable(config: Any) -> str | None:
    """Why ``logging.plan=auto`` leaves this run alone (None: it plans it)."""
    if not config.policy.pretrained:
        return "the policy is an embedded model, not a checkpoint the planner models"
    return None


def plan_run(config: Any, accelerator: Any, run_dir: Path) -> dict[str, Any]:
    """Plan this run's setup and write ``plan.json``; returns the record (``{"made": False,
    "why": ...}`` when ``logging.plan=auto`` skips the run). Raises ``ConfigError`` under
    ``logging.plan=on`` when the model cannot be planned."""
    from genrl.planning.choice import Setup
    from genrl.planning.plan import plan

    mode = config.logging.plan
    cuda = accelerator.device.type == "cuda"
    if mode == "auto" and not cuda:
        return {"made": False, "why": "logging.plan=auto plans CUDA runs (on: a CPU run too)"}
    why = _plannable(config)
    if why is not None:
        if mode == "on":
            raise ConfigError(f"logging.plan=on: {why}")
        return {"made": False, "why": why}
    memory = (
        torch.cuda.get_device_properties(accelerator.device).total_memory
        if cuda
        else NOMINAL_GPU_MEMORY
    )
    try:
        planned = plan(config, accelerator.num_processes, memory)
    except Exception as err:  # the plan is a report: under auto it never stops the training
        if mode == "on":
            raise
        kind = "" if isinstance(err, ConfigError) else f"the planner failed: {type(err).__name__}: "
        return {"made": False, "why": f"{kind}{err}"}
    strategy = run_strategy(accelerator)
    setup = Setup(config.policy.lora_rank > 0, config.policy.gradient_checkpointing)
    row = next(r for r in planned.rows if r.strategy == strategy and r.setup == setup)
    record = {
        "made": True,
        "model": planned.model,
        "sizes": planned.sizes,
        "strategy": strategy,
        "setup": setup.label,
        "processes": accelerator.num_processes,
        "gpu_memory_bytes": memory,
        "planned_bytes": asdict(row.memory),
        "fits": row.fits,
        "step_flops": row.flops,
        "notes": planned.notes,
    }
    path = run_dir / PLAN_FILE
    with naming_full_disk(path):
        path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def measured(record: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``record`` with the main process's measured peak: ``torch.cuda.max_memory_allocated``
    over the run (since this process started: a resumed run counts from its resumption)."""
    if not record.get("made"):
        return record
    if device.type != "cuda":
        return {
            **record,
            "measured_peak_bytes": None,
            "measured_why": "a CPU run has no allocator statistics; the plan is for GPUs",
        }
    peak = torch.cuda.max_memory_allocated(device)
    total = record["planned_bytes"]["total"]
    return {**record, "measured_peak_bytes": peak, "measured_over_planned": peak / max(total, 1)}


def summary_line(record: dict[str, Any]) -> str:
    """One console line for the run's start."""
    if not record.get("made"):
        return f"genrl: no plan of this run ({record['why']})"
    total = record["planned_bytes"]["total"]
    size = f"{total / 2**30:.2f} GiB" if total >= 2**30 else f"{total / 2**20:.1f} MiB"
    fits = "fits" if record["fits"] else "does NOT fit"
    return (
        f"genrl: planned {size} per GPU for {record['strategy']}, {record['setup']} "
        f"({fits} in {record['gpu_memory_bytes'] / 2**30:.0f} GiB); {PLAN_FILE} has the parts"
    )
