"""This process's part of a global batch, and gathering tensors from every process.

Each process holds a contiguous slice of the global sample list (``process_slice``); rewards
and advantage inputs are gathered (``gather``) before advantages are computed, which keeps them
identical for any number of processes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from accelerate import Accelerator


def process_slice(num_global: int, num_processes: int, process_index: int) -> slice:
    """The contiguous part of a global batch of ``num_global`` samples owned by one process."""
    if num_global % num_processes:
        raise ValueError(
            f"the global batch ({num_global} samples) must divide evenly over "
            f"{num_processes} processes"
        )
    per = num_global // num_processes
    return slice(process_index * per, (process_index + 1) * per)


def gather(tensor: torch.Tensor, accelerator: Accelerator | None) -> torch.Tensor:
    """Concatenate ``[n, ...]`` tensors of all processes in rank order into ``[N, ...]``."""
    if accelerator is None or accelerator.num_processes == 1:
        return tensor
    # NCCL gathers only device tensors; bring the result back next to the input.
    gathered = accelerator.gather(tensor.contiguous().to(accelerator.device))
    return gathered.to(tensor.device)
