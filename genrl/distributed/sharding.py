"""Fully sharded training (FSDP2) on every machine, through accelerate where it can.

``accelerate launch --config_file genrl/launch_configs/fsdp2_full.yaml`` sets
``ACCELERATE_USE_FSDP=true``. On GPUs accelerate's own FSDP2 plugin wraps the policy in
``accelerator.prepare``. On a CPU-only machine accelerate 1.15 drops the plugin (its state
keeps ``MULTI_CPU`` and would wrap the module with DDP), although torch's
``torch.distributed.fsdp.fully_shard`` works on CPU tensors over gloo; there genrl shards the
policy itself with ``shard_module`` before the optimizer is made (the optimizer must see the
sharded parameters) and hands only the optimizer to ``accelerator.prepare``.

Sharding unit: every element of every outermost ``nn.ModuleList`` of the network (a transformer's blocks
or decoder layers), then the whole network (the remaining embeddings and heads). LoRA works
unchanged: FSDP2 shards frozen and trainable parameters of one block together.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn


def env_requests_fsdp() -> bool:
    """Whether the launcher asked for FSDP (``ACCELERATE_USE_FSDP``, set by ``accelerate
    launch`` from an FSDP config, or by hand for ``torchrun``)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true", "yes")


def shards_itself(accelerator: Any) -> bool:
    """True when genrl must apply FSDP2 itself: FSDP was requested and the accelerator is a
    multi-process CPU one, where accelerate ignores FSDP. Raises for settings FSDP cannot
    serve, saying what to do."""
    if not env_requests_fsdp():
        return False
    kind = str(getattr(accelerator, "distributed_type", ""))
    if kind.endswith("FSDP"):
        version = int(getattr(accelerator.state.fsdp_plugin, "fsdp_version", 1))
        if version != 2:
            raise ValueError(
                "genrl supports FSDP2 only: set fsdp_version: 2 in the accelerate config "
                "(genrl/launch_configs/fsdp2_full.yaml)"
            )
        return False  # accelerate wraps the module in prepare()
    if accelerator.num_processes < 2:
        raise ValueError(
            "an FSDP launch config was given to a single process: launch 2 or more processes "
            "(accelerate launch --num_processes N, or torchrun --nproc_per_node N), or drop "
            "ACCELERATE_USE_FSDP"
        )
    if accelerator.device.type != "cpu":
        raise ValueError(
            f"FSDP was requested but accelerate set up {kind} on {accelerator.device}; use "
            "accelerate launch --config_file genrl/launch_configs/fsdp2_full.yaml"
        )
    return True


def shard_module(module: nn.Module) -> nn.Module:
    """Apply FSDP2 (``fully_shard``) to every element of every ``nn.ModuleList`` of ``module``
    and then to ``module`` itself, in place; returns ``module``. Needs an initialised process
    group (accelerate's)."""
    from torch.distributed.fsdp import fully_shard

    blocks: list[str] = []
    for name, child in module.named_modules():
        inside = any(name.startswith(block + ".") for block in blocks)
        if isinstance(child, nn.ModuleList) and not inside:
            # The outermost lists only: a block's own lists (attention's to_out) stay in it.
            blocks.extend(f"{name}.{index}" if name else str(index) for index in range(len(child)))
    for name in blocks:
        fully_shard(module.get_submodule(name))
    fully_shard(module)
    return module


def is_sharded(module: nn.Module) -> bool:
    """Whether FSDP2 has sharded ``module`` (its parameters are ``DTensor``s)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a ``DTensor`` shard (a collective: every process must call it), or
    ``tensor`` itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@contextlib.contextmanager
def gathered(module: nn.Module, main: bool) -> Iterator[None]:
    """Inside, ``state_dict()`` of ``module`` and of each of its submodules returns whole
    weights on the CPU on the ``main`` process, so that export code (``save_pretrained``,
    peft's ``get_peft_model_state_dict``) writes full tensors. A collective: every process
    enters it (the other processes take part in the gathering and see the module unchanged).

    FSDP2's own ``state_dict`` hooks always return the shards (``DTensor``s), even while a
    unit is unsharded, hence the full state dict of
    ``torch.distributed.checkpoint.state_dict.get_model_state_dict`` served in their place."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(module, options=options)
    patched = []
    if main:
        # Tied weights (an LM head sharing the embedding) share one tensor, as in the module,
        # so that save_pretrained recognises and drops the tie.
        first: dict[int, str] = {}
        for name, param in module.named_parameters(remove_duplicate=False):
            tied = first.setdefault(id(param), name)
            if tied != name and tied in full and name in full:
                full[name] = full[tied]
        for name, sub in module.named_modules():
            prefix = f"{name}." if name else ""

            def whole(*args: Any, _prefix: str = prefix, **kwargs: Any) -> dict[str, Any]:
                del args, kwargs
                return {k[len(_prefix) :]: v for k, v in full.items() if k.startswith(_prefix)}

            sub.state_dict = whole
            patched.append(sub)
    try:
        yield
    finally:
        for sub in patched:
            del sub.state_dict


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def save_shards(module: nn.Module, optimizer: Any, directory: Path) -> None:
    """Every process writes its shard of ``module``'s trainable weights and of the optimizer
    state into ``directory`` with torch distributed checkpointing (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, optim = get_state_dict(module, _inner(optimizer))
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    weights = {k: v for k, v in weights.items() if k in trainable}
    dcp.save({"model": weights, "optimizer": optim}, checkpoint_id=str(directory))


def load_shards(module: nn.Module, optimizer: Any, directory: Path) -> None:
    """Restore what ``save_shards`` wrote into the sharded ``module`` and its optimizer (a
    collective; resharding to another process count is left to torch's planner)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    inner = _inner(optimizer)
    weights, optim = get_state_dict(module, inner)
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    weights = {k: v for k, v in weights.items() if k in trainable}
    state: dict[str, Any] = {"model": weights, "optimizer": optim}
    dcp.load(state, checkpoint_id=str(directory))  # in place, into these shards
    set_state_dict(
        module,
        inner,
        model_state_dict=weights,
        optim_state_dict=optim,
        options=StateDictOptions(strict=False),
    )


__all__ = [
    "env_requests_fsdp",
    "full_tensor",
    "gathered",
    "is_sharded",
    "load_shards",
    "save_shards",
    "shard_module",
    "shards_itself",
]
