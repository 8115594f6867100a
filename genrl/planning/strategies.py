"""Per-GPU memory of a training setup under each way of spreading it over GPUs.

The inputs (``Footprint``) are exact byte counts of the fake-built model and the traced peaks of
its steps; the strategies divide them as each one does (Rajbhandari et al. 2020, "ZeRO", table
1 and section 5; Zhao et al. 2023, "PyTorch FSDP", section 3):

| strategy | parameters | gradients | optimizer states | transient |
|---|---|---|---|---|
| DDP | whole | whole, plus the reducer's buckets (another copy) | whole | - |
| FSDP2 full shard | 1/N (the trained module) | 1/N | 1/N | two blocks gathered (the one running and the prefetched one) |
| FSDP2 shard-grad-op | 1/N, and whole after the forward (kept gathered until backward) | 1/N | 1/N | - |
| ZeRO-2 | whole | 1/N | 1/N | - |
| ZeRO-3 | 1/N | 1/N | 1/N | two blocks gathered |

Frozen components outside the trained module (text encoders, VAE) stay whole on every GPU:
only ``policy.module`` is prepared by the accelerator (``genrl/run/build.py``, step 6).

A step's peak is the largest of three phases, each over what persists (parameters, optimizer
states, the EMA and the reference copy): the rollout (its forward's peak), the training minibatch
(the gradients and the forward-backward peak) and the optimizer step (the gradients and AdamW's
``foreach`` temporaries, about one float32 copy of the trainable parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

ADAM_STATE_BYTES = 8  # exp_avg and exp_avg_sq, float32, per trainable parameter


@dataclass(frozen=True)
class Footprint:
    """What one training setup (LoRA or full, with or without checkpointing) holds on a GPU
    before any sharding, in bytes.

    Attributes:
        module_bytes: the trained module's parameters as stored (trainable ones float32, frozen
            ones in ``policy.dtype``): what FSDP / ZeRO-3 shard.
        trainable_bytes: the trainable parameters (float32); gradients are the same size.
        trainable_count: how many trainable parameters (AdamW keeps two float32 states each).
        frozen_bytes: frozen components outside the trained module (text encoders, VAE).
        reference_bytes: the reference copy full fine-tuning keeps when the algorithm uses one
            (0 under LoRA, whose reference is the adapter switched off, or when offloaded).
        ema_bytes: the EMA of the trainable weights (float32), when ``optim.ema_decay`` is set.
        block_bytes: the largest transformer block's parameters (FSDP's unit).
        activation_bytes: the training minibatch's forward-backward peak, gradients excluded.
        rollout_bytes: one rollout step's forward peak (no gradients).
    """

    module_bytes: int
    trainable_bytes: int
    trainable_count: int
    frozen_bytes: int
    reference_bytes: int
    ema_bytes: int
    block_bytes: int
    activation_bytes: int
    rollout_bytes: int


@dataclass(frozen=True)
class Strategy:
    """A way to spread training over GPUs and what it shards."""

    name: str
    launch_config: str
    shards_parameters: bool
    shards_gradients: bool
    shards_optimizer: bool
    gathers_blocks: bool
    keeps_gathered: bool = False
    supports_ema: bool = True
    note: str = ""


STRATEGIES: tuple[Strategy, ...] = (
    Strategy("DDP", "ddp.yaml", False, False, False, False),
    Strategy("FSDP2", "fsdp2_full.yaml", True, True, True, True, supports_ema=False),
    Strategy(
        "FSDP2-SGO",
        "fsdp2_full.yaml",
        True,
        True,
        True,
        False,
        keeps_gathered=True,
        supports_ema=False,
        note="fsdp_reshard_after_forward: false",
    ),
    Strategy("ZeRO-2", "zero2.yaml", False, True, True, False),
    Strategy("ZeRO-3", "zero3.yaml", True, True, True, True, supports_ema=False),
)
STRATEGY_NAMES = tuple(s.name for s in STRATEGIES)


@dataclass(frozen=True)
class Memory:
    """Per-GPU bytes of one strategy on ``gpus`` GPUs, by kind, and the phase peak."""

    parameters: int
    gradients: int
    optimizer: int
    reference: int
    activations: int
    rollout: int
    transient: int
    total: int


def _share(value: int, gpus: int, sharded: bool) -> int:
    """A sharded tensor's bytes on one GPU: an even split, rounded up (FSDP2 pads dim 0 to a
    multiple of the world size; ZeRO pads its flat partition)."""
    return -(-value // gpus) if sharded else value


def memory(f: Footprint, s: Strategy, gpus: int) -> Memory:
    """Per-GPU memory of footprint ``f`` under strategy ``s`` on ``gpus`` GPUs."""
    module = _share(f.module_bytes, gpus, s.shards_parameters and gpus > 1)
    if s.keeps_gathered and gpus > 1:
        module += f.module_bytes  # the whole module stays gathered from forward to backward
    parameters = module + f.frozen_bytes + f.ema_bytes
    gradients = _share(f.trainable_bytes, gpus, s.shards_gradients and gpus > 1)
    if not s.shards_gradients and gpus > 1:
        gradients *= 2  # DDP's reducer buckets hold a second copy (gradient_as_bucket_view off)
    optimizer = _share(f.trainable_count * ADAM_STATE_BYTES, gpus, s.shards_optimizer)
    gathered = 2 * f.block_bytes if s.gathers_blocks and gpus > 1 else 0
    persistent = parameters + optimizer + f.reference_bytes
    step_temporaries = _share(f.trainable_bytes, gpus, s.shards_optimizer)
    phases = (
        f.rollout_bytes + gathered,
        gradients + f.activation_bytes + gathered,
        gradients + step_temporaries,
    )
    return Memory(
        parameters=parameters,
        gradients=gradients,
        optimizer=optimizer,
        reference=f.reference_bytes,
        activations=f.activation_bytes,
        rollout=f.rollout_bytes,
        transient=gathered,
        total=persistent + max(phases),
    )
