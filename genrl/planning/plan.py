"""``genrl plan``: a recipe's per-GPU memory and step time under each training setup.

The recipe's real-size model is built from its config (``modelling.py``) on fake tensors; one
rollout step (a forward at the rollout batch, without gradients) and one training minibatch (a
forward and backward at ``train.minibatch_size``) are traced (``tracing.py``) for each of LoRA
and full fine-tuning, with and without gradient checkpointing; ``strategies.py`` spreads the
result over the GPUs. Nothing is allocated: the peak RSS of a plan of Wan 14B is a few hundred MB.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from genrl.config.errors import ConfigError
from genrl.planning.choice import Row, Setup, cheapest, notes, rows, smaller_minibatch
from genrl.planning.copies import model_copies
from genrl.planning.local_models import spec_from_directory
from genrl.planning.modelling import (
    ModelSpec,
    add_lora,
    build_component,
    default_lora_targets,
    model_keys,
    parameter_bytes,
    parameter_count,
    repeated_blocks,
    set_dtype,
    spec_for_checkpoint,
)
from genrl.planning.strategies import Footprint
from genrl.planning.tracing import Trace, autocast, trace
from genrl.planning.workloads import FAMILIES, Family, Sizes, training_loss

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
AUTOCAST = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_LORA_RANK = 32  # Flow-GRPO's rank, offered when the recipe trains every weight


@dataclass
class Plan:
    recipe: str
    model: str
    model_source: str
    sizes: str
    gpus: int
    gpu_memory: int
    usable_memory: int
    tflops: float
    mfu: float
    batches: dict[str, int]
    parameters: dict[str, int]
    rows: list[Row]
    best: Row | None
    smaller: Row | None = None
    footprints: dict[str, Footprint] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _checkpointing(module: Any, on: bool) -> None:
    """Gradient checkpointing of each block, as the adapters turn it on."""
    if hasattr(module, "gradient_checkpointing_enable"):  # transformers
        if on:
            module.gradient_checkpointing_enable({"use_reentrant": False})
        else:
            module.gradient_checkpointing_disable()
    elif on:
        module.enable_gradient_checkpointing()
    else:
        module.disable_gradient_checkpointing()


def _trace_training(
    module: torch.nn.Module,
    family: Family,
    sizes: Sizes,
    batch: int,
    compute: torch.dtype | None,
    input_dtype: torch.dtype,
) -> Trace:
    """One training minibatch: forward, the loss, backward."""

    def train() -> None:
        inputs = family.inputs(module, sizes, batch, False, input_dtype)
        with autocast(compute):
            out = family.output(module(**inputs))
        training_loss(out, not family.guided).backward()

    module.train()
    return trace(train, module)


def _trace_rollout(
    module: torch.nn.Module,
    family: Family,
    sizes: Sizes,
    batch: int,
    compute: torch.dtype | None,
    input_dtype: torch.dtype,
) -> Trace:
    """One rollout step: a forward without gradients (checkpointing changes nothing here)."""

    def rollout() -> None:
        inputs = family.inputs(module, sizes, batch, True, input_dtype)
        with torch.no_grad(), autocast(compute):
            out = module(**inputs)
            del out

    module.eval()
    return trace(rollout)


def _batches(config: Any, family: Family, gpus: int) -> dict[str, int]:
    """Per-process batch of one training forward and of one rollout step (both doubled by a
    batched classifier-free guidance)."""
    t = config.train
    guided = family.guided and getattr(config.sampler, "guidance_scale", 1.0) > 1.0
    branches = 2 if guided else 1
    local = math.ceil(t.prompts_per_iteration * t.group_size / gpus)
    rollout = min(t.rollout_batch_size or local, local)
    return {"train": t.minibatch_size * branches, "rollout": rollout * branches, "local": local}


def model_for(config: Any) -> ModelSpec:
    """The model file of ``policy.pretrained``: a local checkpoint folder's own configs, or the
    file in ``models/`` that lists the hub id."""
    pretrained = config.policy.pretrained
    if pretrained and Path(pretrained).is_dir():
        return spec_from_directory(pretrained, config.policy.name)
    spec = spec_for_checkpoint(pretrained)
    if spec is None:
        raise ConfigError(
            f"policy.pretrained: genrl plan has no model config for {config.policy.pretrained!r} "
            f"(genrl/planning/models/ holds {', '.join(model_keys())})"
        )
    return spec


def plan(
    config: Any,
    gpus: int,
    gpu_memory: int,
    tflops: float = 989.0,
    mfu: float = 0.4,
    prompt_tokens: int = 256,
    spec: ModelSpec | None = None,
    reserve: float = 0.1,
) -> Plan:
    """The plan of ``config`` (a validated ``TrainConfig``) on ``gpus`` GPUs of ``gpu_memory``
    bytes, at ``tflops`` peak dense TFLOP/s per GPU (H100 SXM bf16: 989) and ``mfu``; a setup
    fits when it leaves ``reserve`` of the memory free (CUDA context, allocator
    fragmentation, the reward models); ``spec`` replaces the model file found from
    ``policy.pretrained`` (the tests plan tiny models)."""
    return plans(config, [gpus], gpu_memory, tflops, mfu, prompt_tokens, spec, reserve)[0]


def plans(
    config: Any,
    gpu_counts: list[int],
    gpu_memory: int,
    tflops: float = 989.0,
    mfu: float = 0.4,
    prompt_tokens: int = 256,
    spec: ModelSpec | None = None,
    reserve: float = 0.1,
) -> list[Plan]:
    """``plan`` for each GPU count, tracing each training setup once (a rollout step is traced
    once per distinct per-GPU rollout batch)."""
    for g in gpu_counts:
        if g < 1:
            raise ConfigError(f"--gpus must be >= 1, got {g}")
    if not 0 <= reserve < 1:
        raise ConfigError(f"--reserve must be in [0, 1), got {reserve}")
    started = time.perf_counter()
    spec = spec or model_for(config)
    family = FAMILIES[spec.family]
    p = config.policy
    frozen_dtype = DTYPES[p.dtype]
    compute = AUTOCAST[config.train.mixed_precision]
    generation = getattr(config, "generation", None)
    completion = int(getattr(generation, "max_new_tokens", 0) or 0)
    sizes = family.sizes(
        p.kwargs, spec.defaults, {"prompt": prompt_tokens, "completion": completion}
    )
    batches = {g: _batches(config, family, g) for g in gpu_counts}
    reference, lagged = model_copies(config.algorithm)
    rank = p.lora_rank or DEFAULT_LORA_RANK
    counts: dict[str, int] = {}
    with torch.device("meta"):  # frozen components: only their parameters are counted
        frozen_bytes = sum(parameter_bytes(build_component(c, frozen_dtype)) for c in spec.frozen)
    counts["frozen components"] = frozen_bytes // frozen_dtype.itemsize
    footprints: dict[int, dict[Setup, tuple[Footprint, int]]] = {g: {} for g in gpu_counts}
    input_dtype = compute or frozen_dtype
    train_batch = batches[gpu_counts[0]]["train"]
    with FakeTensorMode():
        module = build_component(spec.trained, torch.float32)  # full fine-tuning: float32
        counts["trained module"] = parameter_count(module)
        for lora in (False, True):
            if lora:
                set_dtype(module, frozen_dtype)
                targets = p.lora_target_modules or default_lora_targets(
                    family.lora_targets, module, family.lora_excluded
                )
                if add_lora(module, rank, p.lora_alpha, targets) == 0:
                    raise ConfigError(f"policy.lora_target_modules {targets} match no linear layer")
                counts["LoRA adapter"] = parameter_count(module, trainable=True)
            else:
                module.requires_grad_(True)
            _checkpointing(module, False)
            sampled = {
                b: _trace_rollout(module, family, sizes, b, compute, input_dtype)
                for b in sorted({batches[g]["rollout"] for g in gpu_counts})
            }
            trainable = parameter_bytes(module, trainable=True)
            ref_bytes = 0
            if reference and not lora and not p.reference_offload:
                ref_bytes = counts["trained module"] * frozen_dtype.itemsize
            copies = (trainable if lagged else 0) + (trainable if config.optim.ema_decay else 0)
            blocks = repeated_blocks(module)
            for ckpt in (False, True):
                _checkpointing(module, ckpt)
                trained = _trace_training(module, family, sizes, train_batch, compute, input_dtype)
                for g in gpu_counts:
                    rollout = sampled[batches[g]["rollout"]]
                    footprint = Footprint(
                        module_bytes=parameter_bytes(module),
                        trainable_bytes=trainable,
                        trainable_count=parameter_count(module, trainable=True),
                        frozen_bytes=frozen_bytes,
                        reference_bytes=ref_bytes,
                        ema_bytes=copies,
                        block_bytes=max((parameter_bytes(b) for b in blocks), default=0),
                        activation_bytes=trained.peak_bytes,
                        rollout_bytes=rollout.peak_bytes,
                    )
                    # With a reference (KL), each minibatch also runs a forward without
                    # gradients: a rollout forward's FLOPs per sample at the training batch.
                    flops = trained.flops + rollout.flops
                    if reference:
                        flops += rollout.flops * train_batch // max(batches[g]["rollout"], 1)
                    footprints[g][Setup(lora, ckpt)] = (footprint, flops)
    seconds = time.perf_counter() - started
    usable = int(gpu_memory * (1 - reserve))
    out = []
    for g in gpu_counts:
        planned = rows(config, footprints[g], g, usable, 1 / (tflops * 1e12 * mfu), rank)
        chosen = cheapest(planned, recipe_lora=p.lora_rank > 0)
        out.append(
            Plan(
                recipe=config.recipe,
                model=spec.name,
                model_source=spec.source,
                sizes=sizes.text,
                gpus=g,
                gpu_memory=gpu_memory,
                usable_memory=usable,
                tflops=tflops,
                mfu=mfu,
                batches=batches[g],
                parameters=counts,
                rows=planned,
                best=chosen,
                smaller=None if chosen else smaller_minibatch(config, planned, usable),
                footprints={setup.label: f for setup, (f, _) in footprints[g].items()},
                notes=notes(config, reference, lagged, spec.family),
                seconds=seconds,
            )
        )
    return out
