"""Flow-GRPO step costs at SD3.5-medium scale: sampling step, rollout and training step times and
peak GPU memory, with random weights (no download, no text encoders, no VAE).

The transformer is a ``SD3Transformer2DModel`` with stabilityai/stable-diffusion-3.5-medium's
config (24 MM-DiT layers, 13 of them dual-attention, 24 heads x 64, RMS qk-norm; 2.2B parameters)
and random weights stored in bf16, wrapped in a ``StableDiffusion3Pipeline`` that has only the
transformer and the scheduler. Our SD3 adapter drives it, with the text-encoder hooks replaced by
fixed random embeddings of the real shapes (``prompt_embeds [B, 333, 4096]``, pooled
``[B, 2048]``), and LoRA (r 32, alpha 64, float32) on the attention projections through peft, as
``Trainer`` sets it up. At 512 px the latents are ``[B, 16, 64, 64]`` (1024 image tokens).

Measured, each under bf16 autocast as the trainer runs it:

* sampling step: one ``policy.velocity`` call with CFG on a batch of ``--batch`` samples (one
  batched forward of ``2 * batch``), no grad;
* rollout: Flow-GRPO's ``FlowSDERollout.collect`` of ``--batch`` samples over ``--steps`` SDE steps with log-probs;
* training step: Flow-GRPO's objective's ``loss`` on ``--minibatch`` transitions of that rollout (CFG forward,
  unconditional branch detached), backward, gradient clipping and an AdamW step; with gradient
  checkpointing off and on (toggled on the same model, interleaved);
* peak memory (``torch.cuda.max_memory_allocated``) of each, next to ``genrl plan``'s figure for
  the same step (``benchmarks/planned_step.py``) and the ratio measured / planned.

Usage::

    python benchmarks/gpu_flow_grpo.py                        # H200: about a minute
    python benchmarks/gpu_flow_grpo.py --batch 16 --minibatch 8
    python benchmarks/gpu_flow_grpo.py --device cpu --tiny    # checks the code path, no GPU

The last line of output is one JSON object (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import torch
from planned_step import planned_figures  # benchmarks/planned_step.py
from timing import DTYPES, autocast, synchronize  # benchmarks/timing.py

from genrl.algorithms.flow_grpo import FlowGRPO, FlowGRPOConfig
from genrl.data.rng import RolloutNoise, Streams
from genrl.loop.groups import expand_groups
from genrl.run.config import PolicyConfig, SDESamplingConfig, TrainConfig, TrainLoopConfig

# transformer/config.json of stabilityai/stable-diffusion-3.5-medium.
SD35_MEDIUM = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "pos_embed_max_size": 384,
    "dual_attention_layers": tuple(range(13)),
    "qk_norm": "rms_norm",
}
# The same architecture (dual attention, RMS qk-norm) at toy width, for --tiny.
TINY = {
    **SD35_MEDIUM,
    "sample_size": 8,
    "num_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 4,
    "joint_attention_dim": 32,
    "caption_projection_dim": 32,  # = num_attention_heads * attention_head_dim
    "pooled_projection_dim": 24,
    "pos_embed_max_size": 16,  # up to 128 px
    "dual_attention_layers": (0,),
}
# SD3.5's scheduler (scheduler/scheduler_config.json): Euler, static shift 3.
SCHEDULER = {"shift": 3.0, "num_train_timesteps": 1000}
# 77 CLIP tokens + 256 T5 tokens (the pipeline's default max_sequence_length).
TEXT_TOKENS = 333


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="torch device (default: cuda)")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="toy-width config of the same architecture, 64 px unless given (for CPU checks)",
    )
    parser.add_argument("--batch", type=int, default=8, help="samples per rollout (default: 8)")
    parser.add_argument(
        "--minibatch", type=int, default=4, help="transitions per training step (default: 4)"
    )
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt (default: 4)")
    parser.add_argument("--height", type=int, default=None, help="pixels (default: 512; tiny 64)")
    parser.add_argument("--width", type=int, default=None, help="pixels (default: 512; tiny 64)")
    parser.add_argument("--steps", type=int, default=10, help="rollout SDE steps (default: 10)")
    parser.add_argument("--guidance", type=float, default=4.5, help="CFG scale (default: 4.5)")
    parser.add_argument(
        "--text-tokens",
        type=int,
        default=TEXT_TOKENS,
        help=f"prompt-embedding tokens (default: {TEXT_TOKENS} = 77 CLIP + 256 T5)",
    )
    parser.add_argument("--lora-rank", type=int, default=32, help="LoRA rank (default: 32)")
    parser.add_argument("--lora-alpha", type=float, default=64.0, help="LoRA alpha (default: 64)")
    parser.add_argument(
        "--kl-beta",
        type=float,
        default=0.0,
        help="KL weight; > 0 adds the reference forward to the training step (default: 0)",
    )
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default="bfloat16", help="weights (default: bfloat16)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (default: 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed repeats (default: 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    args = parser.parse_args(argv)
    size = 64 if args.tiny else 512
    args.height = args.height or size
    args.width = args.width or size
    if min(args.batch, args.minibatch, args.group_size, args.steps, args.repeats) < 1:
        parser.error("--batch, --minibatch, --group-size, --steps and --repeats must be >= 1")
    if args.warmup < 0 or args.text_tokens < 1:
        parser.error("--warmup must be >= 0 and --text-tokens >= 1")
    return args


# -- model ---------------------------------------------------------------------------------------
def transformer_config(tiny: bool) -> dict[str, Any]:
    """The config, checked against this diffusers' ``SD3Transformer2DModel`` signature so that a
    renamed field fails loudly instead of silently falling back to a default."""
    from diffusers import SD3Transformer2DModel

    config = dict(TINY if tiny else SD35_MEDIUM)
    accepted = set(inspect.signature(SD3Transformer2DModel.__init__).parameters) - {"self"}
    unknown = sorted(set(config) - accepted)
    if unknown:
        raise SystemExit(f"SD3Transformer2DModel does not take {unknown} in this diffusers")
    return config


def build_policy(args: argparse.Namespace, device: torch.device) -> Any:
    """Our SD3 adapter on a transformer-only pipeline with random weights, LoRA set up."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )

    from pipelines.diffusers.sd3 import SD3Policy

    config = transformer_config(args.tiny)
    dtype = DTYPES[args.dtype]

    class RandomTextSD3Policy(SD3Policy):
        """Fixed random prompt embeddings in place of CLIP-L/G + T5 (same shapes and dtype)."""

        def _embedding(self, text: str) -> dict[str, torch.Tensor]:
            generator = torch.Generator().manual_seed(zlib.crc32(text.encode()))
            embeds = torch.randn(
                1, args.text_tokens, config["joint_attention_dim"], generator=generator
            )
            pooled = torch.randn(1, config["pooled_projection_dim"], generator=generator)
            return {
                "prompt_embeds": embeds.to(self.device, dtype),
                "pooled_prompt_embeds": pooled.to(self.device, dtype),
            }

        def _encode(self, prompts: list[str]) -> dict[str, torch.Tensor]:
            rows = [self._embedding(p) for p in prompts]
            return {k: torch.cat([r[k] for r in rows]) for k in rows[0]}

        def _encode_negative(self) -> dict[str, torch.Tensor]:
            return self._embedding(self.negative_prompt)

    # Random initialisation directly on the device (seconds on a GPU), then cast to the storage
    # dtype, as from_pretrained(torch_dtype=bfloat16) would leave it.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(args.seed)
        with torch.device(device):
            transformer = SD3Transformer2DModel(**config)
        transformer.to(dtype)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=None,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        text_encoder_3=None,
        tokenizer_3=None,
    )
    policy = RandomTextSD3Policy(
        pipeline=pipe, height=args.height, width=args.width, dtype=args.dtype
    )
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(args.seed)
        policy.setup_training(args.lora_rank, args.lora_alpha, None)
    return policy


def train_config(args: argparse.Namespace, num_prompts: int) -> TrainConfig:
    return TrainConfig(
        recipe="gpu_flow_grpo",
        seed=args.seed,
        policy=PolicyConfig(name="sd3", lora_rank=args.lora_rank, lora_alpha=args.lora_alpha),
        sampler=SDESamplingConfig(
            num_steps=args.steps, noise_level=0.7, guidance_scale=args.guidance
        ),
        algorithm=FlowGRPOConfig(kl_beta=args.kl_beta),
        train=TrainLoopConfig(
            prompts_per_iteration=num_prompts,
            group_size=args.group_size,
            minibatch_size=args.minibatch,
        ),
    )


# -- measuring -----------------------------------------------------------------------------------
def timed(device: torch.device, function: Callable[[], Any]) -> tuple[float, float | None, Any]:
    """(seconds, peak GiB allocated during the call or None off-GPU, result)."""
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    result = function()
    synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return seconds, peak, result


def repeat(
    device: torch.device, function: Callable[[], Any], repeats: int, warmup: int
) -> dict[str, float | None]:
    times, peaks = [], []
    for r in range(warmup + repeats):
        seconds, peak, _ = timed(device, function)
        if r >= warmup:
            times.append(seconds)
            peaks.append(peak)
    return {"median_s": statistics.median(times), "peak_gib": _max(peaks)}


def _max(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def make_prompts(batch: int, group_size: int) -> tuple[list[str], torch.Tensor, int]:
    group_size = min(group_size, batch)
    num_prompts = math.ceil(batch / group_size)
    unique = [f"prompt {i}" for i in range(num_prompts)]
    prompts, group_ids = expand_groups(unique, group_size)
    return prompts[:batch], group_ids[:batch], num_prompts


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    wall_start = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but CUDA is not available (use --device cpu --tiny)")
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in ("TRANSFORMERS_VERBOSITY", "DIFFUSERS_VERBOSITY"):
        os.environ.setdefault(name, "error")
    import diffusers
    import peft

    diffusers.utils.logging.disable_progress_bar()

    t0 = time.perf_counter()
    policy = build_policy(args, device)
    build_s = time.perf_counter() - t0
    transformer = policy.pipe.transformer
    num_params = sum(p.numel() for n, p in transformer.named_parameters() if "lora_" not in n)
    num_lora = sum(p.numel() for p in policy.trainable_parameters())
    weights_gib = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None

    prompts, group_ids, num_prompts = make_prompts(args.batch, args.group_size)
    group_ids = group_ids.to(device)
    config = train_config(args, num_prompts)
    sde_rollout, objective = FlowGRPO(config.algorithm, config).build(policy)
    n = len(prompts)

    # Sampling step: one CFG velocity of the whole batch, as every rollout step calls it.
    policy.module.eval()
    with torch.no_grad():
        condition = policy.encode_prompts(prompts)
        policy.null_condition(condition)  # encode the negative prompt once, as a rollout would
    x = torch.randn(n, *policy.latent_shape, generator=torch.Generator().manual_seed(args.seed))
    x = x.to(device)
    sigma = sde_rollout.sampler.sigmas[args.steps // 2].expand(n).to(device)

    def sampling_step() -> torch.Tensor:
        with torch.no_grad(), autocast(device, args.dtype):
            return policy.velocity(x, sigma, condition, args.guidance)

    sampling = repeat(device, sampling_step, args.repeats, args.warmup)
    finite_velocity = bool(torch.isfinite(sampling_step()).all())

    # One rollout with log-probs (also supplies the training transitions).
    def rollout_call(iteration: int) -> Any:
        noise = RolloutNoise(args.seed, iteration, num_global=n, local=slice(0, n))
        with torch.no_grad(), autocast(device, args.dtype):
            return sde_rollout.collect(policy, prompts, group_ids, noise), noise

    rollout_s, rollout_peak, (rollout, noise) = timed(device, lambda: rollout_call(0))
    finite_rollout = bool(torch.isfinite(rollout.latents).all())
    rollout.advantages = torch.randn(n, generator=torch.Generator().manual_seed(args.seed))
    rollout.advantages = rollout.advantages.to(device)
    with torch.no_grad():
        units = objective.units(policy, rollout, noise)
    if args.minibatch > len(units):
        raise SystemExit(f"--minibatch {args.minibatch} > {len(units)} transitions in the rollout")
    order = noise.local_permutation((Streams.MINIBATCH_ORDER, 0), len(units))[: args.minibatch]
    minibatch = units.select(order.to(device))

    # Training steps, checkpointing off/on on the same model and minibatch, interleaved.
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-5, weight_decay=1e-4)
    losses: list[float] = []

    def train_step() -> None:
        policy.module.train()
        with autocast(device, args.dtype):
            loss, _ = objective.loss(policy, minibatch)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))

    modes = {
        "off": transformer.disable_gradient_checkpointing,
        "on": transformer.enable_gradient_checkpointing,
    }
    train_times: dict[str, list[float]] = {m: [] for m in modes}
    train_peaks: dict[str, list[float | None]] = {m: [] for m in modes}
    for r in range(max(1, args.warmup) + args.repeats):
        for mode in list(modes) if r % 2 == 0 else list(modes)[::-1]:
            modes[mode]()
            seconds, peak, _ = timed(device, train_step)
            if r >= max(1, args.warmup):
                train_times[mode].append(seconds)
                train_peaks[mode].append(peak)
    transformer.disable_gradient_checkpointing()
    training = {
        m: {"median_s": statistics.median(train_times[m]), "peak_gib": _max(train_peaks[m])}
        for m in modes
    }
    finite_loss = all(math.isfinite(v) for v in losses)

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows = [
        (f"sampling step (CFG forward, batch {n})", sampling["median_s"], sampling["peak_gib"]),
        (f"rollout ({n} samples x {args.steps} steps)", rollout_s, rollout_peak),
        (
            f"train step, no checkpointing ({args.minibatch})",
            training["off"]["median_s"],
            training["off"]["peak_gib"],
        ),
        (
            f"train step, checkpointing ({args.minibatch})",
            training["on"]["median_s"],
            training["on"]["peak_gib"],
        ),
    ]
    name = "tiny SD3.5-like" if args.tiny else "SD3.5-medium-sized"
    print(
        f"{name} transformer ({num_params / 1e6:.2f}M params, LoRA r{args.lora_rank} "
        f"{num_lora / 1e6:.2f}M trainable), {args.height}x{args.width}, latents "
        f"{list(policy.latent_shape)}, {args.text_tokens} text tokens, guidance {args.guidance}, "
        f"{args.dtype} on {device_name}"
    )
    header = f"{'measurement':<42}  {'median s':>9}  {'peak GiB':>8}"
    print(header)
    print("-" * len(header))
    for label, seconds, peak in rows:
        shown = "-" if peak is None else f"{peak:.2f}"
        print(f"{label:<42}  {seconds:>9.4f}  {shown:>8}")
    planned = planned_figures(transformer_config(args.tiny), args, n, num_prompts)
    pairs = {
        "sampling_step": (sampling["peak_gib"], planned["planned_sampling_step_gib"]),
        "train_step_no_checkpointing": (
            training["off"]["peak_gib"], planned["planned_train_step_gib_no_checkpointing"]
        ),
        "train_step_checkpointing": (
            training["on"]["peak_gib"], planned["planned_train_step_gib_checkpointing"]
        ),
    }  # fmt: skip
    for label, (peak, estimate) in pairs.items():
        shown = "-" if peak is None else f"{peak:.2f} measured, {peak / estimate:.2f}x"
        print(f"{label:<42}  planned {estimate:.3f} GiB ({shown})")
    measured_over_planned = {
        f"{k}_measured_over_planned": _round(None if m is None else m / e, 4)
        for k, (m, e) in pairs.items()
    }
    ratio = training["on"]["median_s"] / training["off"]["median_s"]
    print(
        f"checkpointing on/off train time ratio {ratio:.3f}; finite: velocity "
        f"{finite_velocity}, rollout {finite_rollout}, loss {finite_loss}"
    )

    summary = {
        "benchmark": "gpu_flow_grpo",
        "sampling_step_s": round(sampling["median_s"], 5),
        "sampling_step_peak_gib": _round(sampling["peak_gib"]),
        "sampling_samples_per_s_per_step": round(n / sampling["median_s"], 3),
        "rollout_s": round(rollout_s, 4),
        "rollout_peak_gib": _round(rollout_peak),
        "rollout_samples_per_s": round(n / rollout_s, 3),
        "train_step_s_no_checkpointing": round(training["off"]["median_s"], 5),
        "train_step_s_checkpointing": round(training["on"]["median_s"], 5),
        "checkpointing_over_plain_train_time_ratio": round(ratio, 4),
        "train_step_peak_gib_no_checkpointing": _round(training["off"]["peak_gib"]),
        "train_step_peak_gib_checkpointing": _round(training["on"]["peak_gib"]),
        "weights_gib": _round(weights_gib),
        **planned,
        **measured_over_planned,
        "finite": finite_velocity and finite_rollout and finite_loss,
        "transformer_parameters": num_params,
        "lora_parameters": num_lora,
        "tiny": args.tiny,
        "transformer_config": {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in transformer_config(args.tiny).items()
        },
        "batch": n,
        "minibatch": args.minibatch,
        "group_size": min(args.group_size, n),
        "height": args.height,
        "width": args.width,
        "latent_shape": list(policy.latent_shape),
        "text_tokens": args.text_tokens,
        "steps": args.steps,
        "guidance_scale": args.guidance,
        "kl_beta": args.kl_beta,
        "lora_rank": args.lora_rank,
        "lora_alpha": args.lora_alpha,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "device": device_name,
        "build_s": round(build_s, 2),
        "torch_version": torch.__version__,
        "diffusers_version": diffusers.__version__,
        "peft_version": peft.__version__,
        "wall_seconds": round(time.perf_counter() - wall_start, 2),
    }
    print(json.dumps(summary))
    sys.stdout.flush()


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


if __name__ == "__main__":
    main()
