"""What genrl does differently when accelerate runs DeepSpeed (``genrl/launch_configs/zero*.yaml``).

accelerate's DeepSpeed path differs from DDP and FSDP in three ways the loop must respect:

* the engine clips, steps the optimizer and zeroes the gradients inside
  ``accelerator.backward`` whenever ``accelerator.sync_gradients`` is set, and the prepared
  optimizer's ``step``/``zero_grad`` do nothing. genrl accumulates gradients itself, so the
  updater (``genrl/loop/optimization.py``) sets ``sync_gradients`` only on the last minibatch of an
  accumulation window, sets the LR before that backward, and reads the gradient norm from the
  engine (the gradients are partitioned under ZeRO-2/3);
* the clipping threshold is the DeepSpeed config's ``gradient_clipping``, so ``align_config``
  makes it the recipe's ``optim.max_grad_norm`` before ``accelerator.prepare`` (the shipped
  configs say 1.0; a recipe's own value wins, as its batch sizes do);
* the optimizer state is partitioned over processes (and under ZeRO-3 the parameters too), so a
  genrl checkpoint (whole tensors from the main process) cannot hold it: checkpoints are
  skipped with a warning and ``--resume`` is refused (``refuse_checkpoint``); resumable sharded
  runs use the FSDP2 configs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn


def uses_deepspeed(accelerator: Any) -> bool:
    """Whether accelerate set up DeepSpeed for this run."""
    return str(getattr(accelerator, "distributed_type", "")).upper().endswith("DEEPSPEED")


def zero_stage(accelerator: Any) -> int:
    """The ZeRO stage of a DeepSpeed run (0 when DeepSpeed is not in use)."""
    if not uses_deepspeed(accelerator):
        return 0
    plugin = accelerator.state.deepspeed_plugin
    return int(plugin.deepspeed_config.get("zero_optimization", {}).get("stage", plugin.zero_stage))


def align_config(accelerator: Any, max_grad_norm: float | None, minibatch_size: int) -> None:
    """Fill the DeepSpeed config from the recipe before ``accelerator.prepare`` hands it to
    ``deepspeed.initialize``: clipping at ``optim.max_grad_norm`` (0, DeepSpeed's "off", for
    None), and, where the config says "auto", ``train_micro_batch_size_per_gpu`` from
    ``train.minibatch_size``: accelerate takes that size from a prepared dataloader, and genrl
    prepares none (its prompts are not a dataloader), so without it ``prepare`` raises."""
    if not uses_deepspeed(accelerator):
        return
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    config["gradient_clipping"] = float(max_grad_norm or 0.0)
    if config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        config["train_micro_batch_size_per_gpu"] = int(minibatch_size)


def refuse_checkpoint(accelerator: Any, action: str) -> str | None:
    """The reason ``action`` ("write a checkpoint", "resume") is not served under DeepSpeed, or
    None when it is."""
    if not uses_deepspeed(accelerator):
        return None
    return (
        f"genrl cannot {action} under DeepSpeed yet (ZeRO partitions the optimizer state over "
        "processes, and genrl checkpoints hold whole tensors): use "
        "genrl/launch_configs/fsdp2_full.yaml or fsdp2_lora.yaml for a resumable sharded run, "
        "or ddp.yaml"
    )


@contextlib.contextmanager
def zero3_gathered(module: nn.Module, accelerator: Any) -> Iterator[None]:
    """Inside, the parameters of ``module`` are whole on every process under ZeRO-3 (they are
    empty placeholders otherwise), so that ``trainable_state_dict`` and exports read real
    weights; a collective. Does nothing for other engines."""
    if zero_stage(accelerator) != 3:
        yield
        return
    import deepspeed  # type: ignore[import-untyped]

    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
        yield


__all__ = ["align_config", "refuse_checkpoint", "uses_deepspeed", "zero3_gathered", "zero_stage"]
