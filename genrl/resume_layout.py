"""Resuming a checkpoint on another layout: another process count, or from sharded to whole.

A DDP checkpoint holds whole tensors (the trainable weights and a torch optimizer state), so any
number of DDP processes can load it. A sharded (FSDP2) checkpoint holds torch distributed
checkpointing's shards; DCP reshards them on load, into the shards of another FSDP2 layout or
into the whole tensors of a DDP run or a single process (``load_shards`` asks for the state dict
of the module it is given, sharded or not). The one direction not served is a DDP checkpoint into
a sharded run: its optimizer state is indexed by parameter position, not by name, and genrl
does not convert it; the error says how to resume it instead.

What is exact: weights, optimizer state, LR schedule position, counters, RNG states and every
named random stream (``genrl/rng.py``) are restored whatever the process count, so the next
iteration's prompts, noise, rewards and advantages (flow runs, ``train.noise_layout=global``)
equal an uninterrupted run's. What is not: each process shuffles its own share of the batch
into minibatches, so with another process count the minibatches, and the updates after the
first one, differ from the uninterrupted run's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from genrl.checkpoint import CheckpointError
from genrl.sharding import is_sharded, load_shards


def restore_weights(policy: Any, optimizer: Any, data: dict[str, Any], path: Path) -> None:
    """Load the trainable weights and optimizer state of the checkpoint ``data`` (read from
    ``path`` by ``genrl.checkpoint.load_checkpoint``) into ``policy`` and ``optimizer``,
    resharding where torch distributed checkpointing can. A collective under FSDP2 and for a
    sharded checkpoint (every process calls it)."""
    run_sharded = is_sharded(policy.network)
    if "sharded" in data:
        # DCP reads the shards into whatever state dict the module has: shards or whole tensors.
        load_shards(policy.network, optimizer, path)
        return
    if run_sharded:
        raise CheckpointError(
            f"{path} was written by a DDP (unsharded) run and cannot resume a sharded (FSDP) one: "
            "resume it without FSDP (accelerate launch --config_file "
            "genrl/launch_configs/ddp.yaml, or torchrun without ACCELERATE_USE_FSDP), on any "
            "number of processes"
        )
    policy.load_trainable_state_dict(data["trainable"])
    optimizer.load_state_dict(data["optimizer"])


def layout_notice(
    state: dict[str, Any], num_processes: int, sharded_checkpoint: bool
) -> str | None:
    """A one-line notice when the checkpoint's process count differs from this run's (None
    otherwise, and for checkpoints written before the count was recorded)."""
    saved = state.get("num_processes")
    if saved is None or int(saved) == num_processes:
        return None
    kind = "sharded (FSDP2) " if sharded_checkpoint else ""
    plural = "process" if int(saved) == 1 else "processes"
    return (
        f"genrl: resuming a {kind}checkpoint written by {int(saved)} {plural} on "
        f"{num_processes}: weights, optimizer, counters and random streams are restored; "
        "minibatches differ from an uninterrupted run's, so later updates do too"
    )


__all__ = ["layout_notice", "restore_weights"]
