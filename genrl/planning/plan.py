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
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from genrl.config.errors import ConfigError
from genrl.planning.copies import model_copies
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
from genrl.planning.strategies import STRATEGIES, Footprint, Memory, memory
from genrl.planning.tracing import Trace, autocast, trace
from genrl.planning.workloads import FAMILIES, Family, Sizes, training_loss

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
AUTOCAST = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_LORA_RANK = 32  # Flow-GRPO's rank, offered when the recipe trains every weight


@dataclass(frozen=True)
class Setup:
    """One training setup: LoRA or full fine-tuning, gradient checkpointing on or off."""

    lora: bool
    checkpointing: bool

    @property
    def label(self) -> str:
        return f"{'LoRA' if self.lora else 'full'}{' +ckpt' if self.checkpointing else ''}"


@dataclass(frozen=True)
class Row:
    """One strategy with one setup on the requested GPUs."""

    strategy: str
    setup: Setup
    memory: Memory
    fits: bool
    flops: int
    seconds: float
    flags: list[str]
    launch: str
    refused: str = ""


@dataclass
class Plan:
    recipe: str
    model: str
    model_source: str
    sizes: str
    gpus: int
    gpu_memory: int
    tflops: float
    mfu: float
    batches: dict[str, int]
    parameters: dict[str, int]
    rows: list[Row]
    best: Row | None
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


def _traces(
    module: torch.nn.Module,
    family: Family,
    sizes: Sizes,
    batches: dict[str, int],
    compute: torch.dtype | None,
    input_dtype: torch.dtype,
    checkpointing: bool,
) -> tuple[Trace, Trace]:
    """The training minibatch's trace (forward, loss, backward) and one rollout step's."""
    tokens = not family.guided

    def train() -> None:
        inputs = family.inputs(module, sizes, batches["train"], False, input_dtype)
        with autocast(compute):
            out = family.output(module(**inputs))
        training_loss(out, tokens).backward()

    def rollout() -> None:
        inputs = family.inputs(module, sizes, batches["rollout"], True, input_dtype)
        with torch.no_grad(), autocast(compute):
            out = module(**inputs)
            del out

    _checkpointing(module, checkpointing)
    module.train()
    trained = trace(train, module)
    module.eval()
    sampled = trace(rollout)
    return trained, sampled


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
    spec = spec_for_checkpoint(config.policy.pretrained)
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
) -> Plan:
    """The plan of ``config`` (a validated ``TrainConfig``) on ``gpus`` GPUs of ``gpu_memory``
    bytes, at ``tflops`` peak dense TFLOP/s per GPU (H100 SXM bf16: 989) and ``mfu``; ``spec``
    replaces the model file found from ``policy.pretrained`` (the tests plan tiny models)."""
    if gpus < 1:
        raise ConfigError(f"--gpus must be >= 1, got {gpus}")
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
    batches = _batches(config, family, gpus)
    reference, lagged = model_copies(config.algorithm)
    rank = p.lora_rank or DEFAULT_LORA_RANK
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    footprints: dict[Setup, tuple[Footprint, int]] = {}
    with mode:
        frozen_bytes = 0
        for component in spec.frozen:
            frozen_bytes += parameter_bytes(build_component(component, frozen_dtype))
        module = build_component(spec.trained, torch.float32)  # full fine-tuning: float32
        counts = {"trained module": parameter_count(module), "frozen components": 0}
        counts["frozen components"] = frozen_bytes // frozen_dtype.itemsize
        input_dtype = compute or frozen_dtype
        for lora in (False, True):
            if lora:
                set_dtype(module, frozen_dtype)
                targets = p.lora_target_modules or default_lora_targets(family.lora_targets, module)
                if add_lora(module, rank, p.lora_alpha, targets) == 0:
                    raise ConfigError(f"policy.lora_target_modules {targets} match no linear layer")
                counts["LoRA adapter"] = parameter_count(module, trainable=True)
            module.requires_grad_(not lora)
            if lora:
                for name, param in module.named_parameters():
                    param.requires_grad_("lora_" in name)
            for ckpt in (False, True):
                trained, sampled = _traces(
                    module, family, sizes, batches, compute, input_dtype, ckpt
                )
                trainable = parameter_bytes(module, trainable=True)
                ref_bytes = 0
                if reference and not lora and not p.reference_offload:
                    ref_bytes = counts["trained module"] * frozen_dtype.itemsize
                copies = (trainable if lagged else 0) + (trainable if config.optim.ema_decay else 0)
                blocks = repeated_blocks(module)
                footprint = Footprint(
                    module_bytes=parameter_bytes(module),
                    trainable_bytes=trainable,
                    trainable_count=parameter_count(module, trainable=True),
                    frozen_bytes=frozen_bytes,
                    reference_bytes=ref_bytes,
                    ema_bytes=copies,
                    block_bytes=max((parameter_bytes(b) for b in blocks), default=0),
                    activation_bytes=trained.peak_bytes,
                    rollout_bytes=sampled.peak_bytes,
                )
                # A reference forward per minibatch (KL) adds a forward's FLOPs.
                flops = trained.flops + sampled.flops
                if reference:
                    flops += sampled.flops * batches["train"] // max(batches["rollout"], 1)
                footprints[Setup(lora, ckpt)] = (footprint, flops)
    rows = _rows(config, footprints, gpus, gpu_memory, tflops, mfu, rank)
    chosen = _cheapest(rows, recipe_lora=p.lora_rank > 0)
    return Plan(
        recipe=config.recipe,
        model=spec.name,
        model_source=spec.source,
        sizes=sizes.text,
        gpus=gpus,
        gpu_memory=gpu_memory,
        tflops=tflops,
        mfu=mfu,
        batches=batches,
        parameters=counts,
        rows=rows,
        best=chosen,
        footprints={setup.label: f for setup, (f, _) in footprints.items()},
        notes=_notes(config, reference, lagged, spec),
        seconds=time.perf_counter() - started,
    )


def _flags(config: Any, setup: Setup, rank: int) -> list[str]:
    """The ``--set`` flags that select ``setup`` from the recipe."""
    p, flags = config.policy, []
    if setup.lora and p.lora_rank == 0:
        flags.append(f"policy.lora_rank={rank}")
    if not setup.lora and p.lora_rank > 0:
        flags.append("policy.lora_rank=0")
    if setup.checkpointing != p.gradient_checkpointing:
        flags.append(f"policy.gradient_checkpointing={str(setup.checkpointing).lower()}")
    return flags


def _rows(config, footprints, gpus, gpu_memory, tflops, mfu, rank) -> list[Row]:
    rows = []
    for setup, (footprint, flops) in footprints.items():
        for strategy in STRATEGIES:
            if gpus == 1 and strategy.name != "DDP":
                continue  # nothing to shard on one GPU: every strategy is the single-GPU run
            flags, refused = _flags(config, setup, rank), ""
            f = footprint
            if config.optim.ema_decay and not strategy.supports_ema:
                # build_run refuses EMA with FSDP and ZeRO-3; planned with the EMA off.
                flags.append("optim.ema_decay=none")
                ema = f.trainable_bytes if config.optim.ema_decay else 0
                f = replace(f, ema_bytes=max(0, f.ema_bytes - ema))
            m = memory(f, strategy, gpus)
            launch = "" if gpus == 1 else strategy.launch_config
            seconds = flops / (tflops * 1e12 * mfu)
            rows.append(
                Row(strategy.name if gpus > 1 else "1 GPU", setup, m, m.total <= gpu_memory,
                    flops, seconds, flags, launch, refused)
            )  # fmt: skip
    return rows


# Cheapest first among strategies of equal memory: less communication.
_ORDER = {"1 GPU": 0, "DDP": 0, "ZeRO-2": 1, "FSDP2-SGO": 2, "FSDP2": 3, "ZeRO-3": 4}


def _cheapest(rows: list[Row], recipe_lora: bool) -> Row | None:
    """The fastest fitting row, keeping the recipe's LoRA-or-full choice when any such row fits
    (switching it changes the experiment); ties go to the strategy that communicates least and
    then to the fewest changed flags."""
    fitting = [r for r in rows if r.fits]
    same = [r for r in fitting if r.setup.lora == recipe_lora]
    pool = same or fitting
    if not pool:
        return None
    return min(pool, key=lambda r: (round(r.seconds, 4), _ORDER[r.strategy], len(r.flags)))


def _notes(config: Any, reference: bool, lagged: bool, spec: ModelSpec) -> list[str]:
    """What the plan leaves out or assumes, in sentences."""
    notes = []
    rewards = ", ".join(r.name for r in config.reward)
    notes.append(f"not modelled: the reward models ({rewards}) and their memory on the GPU")
    generation = getattr(config, "generation", None)
    engine = getattr(generation, "engine", "loop")
    if engine != "loop":
        notes.append(f"not modelled: the {engine} inference engine's weights and KV cache")
    if config.policy.reference_offload:
        notes.append("reference copy offloaded to the CPU (policy.reference_offload): not counted")
    notes.append("not modelled: CPU offload of parameters or optimizer states (FSDP/ZeRO offload)")
    if reference:
        notes.append(
            "reference: full fine-tuning keeps a frozen copy; LoRA switches the adapter off"
        )
    if lagged:
        notes.append("the lagged copy of the trainable weights is counted with the parameters")
    if spec.family in ("causal_lm", "vlm", "masked_lm"):
        notes.append("rollout: one prefill of prompt + completion stands for generation")
    if spec.family == "vlm":
        notes.append("not modelled: the vision tower's forward on the prompt's pictures")
    return notes
