"""Resuming a checkpoint on another layout: another process count, or from sharded to whole.

A DDP checkpoint holds whole tensors (the trainable weights and a torch optimizer state), so any
number of DDP processes can load it, and a sharded (FSDP2) run keeps its shard of each of them
(the optimizer state, numbered by parameter position, is renamed for torch's state-dict API).
A sharded checkpoint holds torch distributed checkpointing's shards; DCP reshards them on load,
into the shards of another FSDP2 layout or into the whole tensors of a DDP run or a single
process (``load_shards`` asks for the state dict of the module it is given, sharded or not).

What is exact: weights, optimizer state, LR schedule position, counters, RNG states and every
named random stream (``genrl/data/rng.py``) are restored whatever the process count, so the next
iteration's prompts, noise, rewards and advantages (flow runs, ``train.noise_layout=global``)
equal an uninterrupted run's. What is not: each process shuffles its own share of the batch
into minibatches, so with another process count the minibatches, and the updates after the
first one, differ from the uninterrupted run's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from genrl.checkpoints.checkpoint import CheckpointError
from genrl.distributed.sharding import is_sharded, load_shards


def restore_weights(policy: Any, optimizer: Any, data: dict[str, Any], path: Path) -> None:
    """Load the trainable weights and optimizer state of the checkpoint ``data`` (read from
    ``path`` by ``genrl.checkpoints.checkpoint.load_checkpoint``) into ``policy`` and ``optimizer``,
    resharding where torch distributed checkpointing can. A collective under FSDP2 and for a
    sharded checkpoint (every process calls it)."""
    run_sharded = is_sharded(policy.network)
    if "sharded" in data:
        # DCP reads the shards into whatever state dict the module has: shards or whole tensors.
        load_shards(policy.network, optimizer, path)
        return
    if run_sharded:
        _whole_into_shards(policy.network, optimizer, data, path)
        return
    policy.load_trainable_state_dict(data["trainable"])
    optimizer.load_state_dict(data["optimizer"])


def _whole_into_shards(network: Any, optimizer: Any, data: dict[str, Any], path: Path) -> None:
    """A DDP checkpoint into a sharded (FSDP2) run: every process holds the whole tensors and
    keeps its shard of them. The torch optimizer state numbers parameters in the order of the
    trainable parameters; torch's state-dict API wants their names, so they are renamed."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    names = [n for n, p in network.named_parameters() if p.requires_grad]
    saved = data["optimizer"]
    count = sum(len(group["params"]) for group in saved["param_groups"])
    if count != len(names) or set(data["trainable"]) != set(names):
        raise CheckpointError(
            f"{path} does not match this policy's {len(names)} trainable parameters (its "
            f"optimizer has {count}): was it saved with another LoRA/full setting?"
        )
    renamed: dict[str, Any] = {
        "state": {names[int(i)]: value for i, value in saved["state"].items()},
        "param_groups": [
            {**group, "params": [names[int(i)] for i in group["params"]]}
            for group in saved["param_groups"]
        ],
    }
    set_state_dict(
        network,
        getattr(optimizer, "optimizer", optimizer),
        model_state_dict=data["trainable"],
        optim_state_dict=renamed,
        options=StateDictOptions(full_state_dict=True, strict=False),
    )


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
