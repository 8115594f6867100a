"""From footprints to rows: each strategy on the GPUs, whether it fits, its ``--set`` flags, the
cheapest that fits, and a smaller minibatch when nothing does."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from genrl.planning.strategies import STRATEGIES, Footprint, Memory, memory


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
    """One strategy with one setup on the requested GPUs. ``estimated`` marks a row whose
    activations were scaled to a smaller minibatch instead of traced."""

    strategy: str
    setup: Setup
    memory: Memory
    fits: bool
    flops: int
    seconds: float
    flags: list[str]
    launch: str
    estimated: bool = False


def setup_flags(config: Any, setup: Setup, rank: int) -> list[str]:
    """The ``--set`` flags that select ``setup`` from the recipe."""
    p, flags = config.policy, []
    if setup.lora and p.lora_rank == 0:
        flags.append(f"policy.lora_rank={rank}")
    if not setup.lora and p.lora_rank > 0:
        flags.append("policy.lora_rank=0")
    if setup.checkpointing != p.gradient_checkpointing:
        flags.append(f"policy.gradient_checkpointing={str(setup.checkpointing).lower()}")
    return flags


def rows(
    config: Any,
    footprints: dict[Setup, tuple[Footprint, int]],
    gpus: int,
    gpu_memory: int,
    seconds_per_flop: float,
    rank: int,
) -> list[Row]:
    """Every strategy for every setup; on one GPU only the single-GPU run (nothing to shard)."""
    out = []
    for setup, (footprint, flops) in footprints.items():
        for strategy in STRATEGIES:
            if gpus == 1 and strategy.name != "DDP":
                continue
            flags, f = setup_flags(config, setup, rank), footprint
            if config.optim.ema_decay and not strategy.supports_ema:
                # build_run refuses EMA under FSDP and ZeRO-3: planned with the EMA off.
                flags.append("optim.ema_decay=none")
                f = replace(f, ema_bytes=max(0, f.ema_bytes - f.trainable_bytes))
            m = memory(f, strategy, gpus)
            name = strategy.name if gpus > 1 else "1 GPU"
            launch = strategy.launch_config if gpus > 1 else ""
            out.append(
                Row(name, setup, m, m.total <= gpu_memory, flops, flops * seconds_per_flop,
                    flags, launch)
            )  # fmt: skip
    return out


# Among rows of equal time, the strategy that communicates least first.
ORDER = {"1 GPU": 0, "DDP": 0, "ZeRO-2": 1, "FSDP2-SGO": 2, "FSDP2": 3, "ZeRO-3": 4}


def cheapest(candidates: list[Row], recipe_lora: bool) -> Row | None:
    """The fastest fitting row, keeping the recipe's LoRA-or-full choice when any such row fits
    (switching it changes the experiment); ties go to the strategy that communicates least and
    then to the fewest changed flags."""
    fitting = [r for r in candidates if r.fits]
    pool = [r for r in fitting if r.setup.lora == recipe_lora] or fitting
    if not pool:
        return None
    return min(pool, key=lambda r: (round(r.seconds, 4), ORDER[r.strategy], len(r.flags)))


def smaller_minibatch(config: Any, candidates: list[Row], gpu_memory: int) -> Row | None:
    """When nothing fits: the largest ``train.minibatch_size`` below the recipe's at which a
    row fits, with its activations scaled linearly in the batch (an estimate: the weight casts
    do not shrink, so the real peak is a little higher; ``genrl plan --set
    train.minibatch_size=K`` traces it). ``gradient_accumulation_steps`` grows so that an
    optimizer step sees the same samples."""
    t = config.train
    per_step = t.minibatch_size * t.gradient_accumulation_steps
    options = []
    for row in candidates:
        m = row.memory
        rest = m.total - max(m.rollout + m.transient, m.gradients + m.activations + m.transient)
        for size in range(t.minibatch_size - 1, 0, -1):
            if per_step % size:
                continue  # the optimizer step must hold a whole number of minibatches
            activations = math.ceil(m.activations * size / t.minibatch_size)
            total = rest + max(m.rollout + m.transient, m.gradients + activations + m.transient)
            if total <= gpu_memory:
                flags = [*row.flags, f"train.minibatch_size={size}",
                         f"train.gradient_accumulation_steps={per_step // size}"]  # fmt: skip
                scaled = replace(m, activations=activations, total=total)
                seconds = row.seconds * size / t.minibatch_size
                options.append(
                    (size, replace(row, memory=scaled, fits=True, flags=flags, seconds=seconds,
                                   estimated=True))
                )  # fmt: skip
                break
    if not options:
        return None
    best_size = max(size for size, _ in options)
    return cheapest([r for size, r in options if size == best_size], config.policy.lora_rank > 0)


def notes(config: Any, reference: bool, lagged: bool, family: str) -> list[str]:
    """What the plan leaves out or assumes, in sentences."""
    out = [f"not modelled: the reward models ({', '.join(r.name for r in config.reward)})"]
    engine = getattr(getattr(config, "generation", None), "engine", "loop")
    if engine != "loop":
        out.append(f"not modelled: the {engine} inference engine's weights and KV cache")
    if config.policy.reference_offload:
        out.append("the reference copy is offloaded to the CPU (policy.reference_offload)")
    out.append("not modelled: CPU offload of parameters or optimizer states (FSDP/ZeRO offload)")
    if reference:
        out.append("ref: full fine-tuning keeps a frozen copy; LoRA switches the adapter off")
    if lagged:
        out.append("the lagged copy of the trainable weights is counted with the parameters")
    if family in ("causal_lm", "vlm", "masked_lm"):
        out.append("rollout: one prefill of prompt + completion stands for generation")
    if family == "vlm":
        out.append("not modelled: the vision tower's forward on the prompt's pictures")
    return out
