"""How a run's processes are set up (one process or many, same code; README.md, "Multi-process")."""

from __future__ import annotations

import os
from typing import Any

import torch


def build_accelerator(mixed_precision: str) -> Any:
    """The run's ``Accelerator``. Launched as several processes (``torchrun``, ``accelerate
    launch --multi_gpu``) on a machine without a device accelerate distributes over, it asks
    for CPU processes: accelerate 1.x joins them into one gloo group only with ``cpu=True`` (or
    ``ACCELERATE_USE_CPU=1``) and otherwise runs each as an independent one-process job, all
    writing the same run directory."""
    from accelerate import Accelerator

    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    return Accelerator(mixed_precision=mixed_precision, cpu=several and not _has_device())


def _has_device() -> bool:
    """A CUDA GPU or another accelerator torch knows, except MPS (no multi-process backend)."""
    accelerators = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerators is not None and accelerators.is_available():
        device = accelerators.current_accelerator()
        return device is not None and device.type != "mps"
    return torch.cuda.is_available()
