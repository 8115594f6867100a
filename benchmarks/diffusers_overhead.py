"""Overhead of our diffusers adapters against the stock pipelines, on tiny random pipelines.

Everything is measured in one process, on pipelines built into a temporary directory by the
builders of ``tests/family_table.FAMILIES`` (SD3, FLUX, SANA, Lumina2, QwenImage, Z-Image,
Chroma, FLUX.2 [dev] and [klein]; ``--families`` picks some) and loaded through ``pipelines.build_policy(family, ...)``.
The table also gives each stock call its guidance arguments (``guidance_scale``, an offset
scale for Z-Image, or ``true_cfg_scale`` with a negative prompt), so both paths run CFG for every
family but FLUX.2 [dev], whose guidance is an embedding: there both paths feed ``--guidance`` to
it and run one forward per step. (a) runs for every family; (b) for the first. Qwen-Image-Edit
(``qwenimage_edit``, not in the test table: its prompts carry a reference image) is compared with
its documented stock use, one ``pipe(image=..., prompt=..., num_images_per_prompt=group,
true_cfg_scale=..., negative_prompt="")`` call per prompt (tests/test_qwenimage_edit.py checks
that the two sample alike); ours encodes every prompt with its image in one batch.

(a) Rollout throughput. Ours is exactly what a training rollout runs,
    ``FlowSDERollout.collect(policy, prompts, group_ids, RolloutNoise(...))``: prompt encoding (each
    distinct prompt once), the Flow-GRPO SDE step with its log-prob at every step, CFG in one
    batched forward, and stacking every state and log-prob. The baseline is a plain
    ``pipe(prompt=..., num_images_per_prompt=group, num_inference_steps=..., guidance_scale=...,
    output_type="latent")`` call on the same pipeline object (so the same transformer, LoRA
    layers included), which also encodes its prompts on every call. Same steps, batch, guidance,
    image size and dtype/autocast. The two are interleaved (alternating order) after warm-ups and
    compared by their median times; when the ratio misses the target (or with ``--profile``) both
    are re-run with per-phase timers to show where the time goes.
(b) Training step time: one optimizer step over one minibatch of rollout transitions
    (Flow-GRPO's objective's ``loss``: the CFG forward with the unconditional branch detached and the SDE
    log-prob; backward; gradient clipping; AdamW step), on two policies built with
    ``gradient_checkpointing=False`` and ``True`` from the same weights and LoRA initialisation,
    on the same minibatch, interleaved.

Usage::

    python benchmarks/diffusers_overhead.py                  # CPU, float32, 1 thread
    python benchmarks/diffusers_overhead.py --quick          # smoke run
    python benchmarks/diffusers_overhead.py --device cuda --dtype bfloat16 --height 128 --width 128

The last line of output is one JSON object (benchmarks/README.md); its headline
``rollout_over_pipe_time_ratio`` is ours / pipe median rollout time for the first family
(target: <= 1.1), ``rollout_over_pipe_time_ratio_by_family`` has every family's and
``max_rollout_over_pipe_time_ratio`` the worst.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from flow_pipes import (
    build_trained_policy,
    make_prompts,
    ours_rollout,
    print_rollout_table,
    profile_phases,
    quiet_libraries,
)
from timing import DTYPES, autocast, synchronize, time_interleaved

from genrl.algorithms.flow_grpo import FlowGRPO, FlowGRPOConfig
from genrl.data.rng import RolloutNoise, Streams
from genrl.loop.groups import expand_groups
from genrl.rollouts.flow_sde import FlowSDERollout
from genrl.run.config import PolicyConfig, SDESamplingConfig, TrainConfig, TrainLoopConfig

TARGET_RATIO = 1.1  # issue 19: ours / pipe at most 1.1 for every family
EDIT = "qwenimage_edit"  # prompts with a reference image; not in tests/family_table.FAMILIES
FAMILY_NAMES = (
    "sd3", "flux", "sana", "lumina2", "qwenimage", "zimage", "chroma", "flux2", "flux2_klein",
    EDIT,
)  # fmt: skip
# Qwen-Image-Edit only when asked for: its pipeline resizes every reference image to about 1024^2
# pixels (4,096 reference tokens next to 16 image tokens at 64 px), so one stock call of 10 steps
# takes 25-40 s on 2 CPU cores, more than every other family together.
DEFAULT_FAMILIES = tuple(name for name in FAMILY_NAMES if name != EDIT)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--families",
        default=",".join(DEFAULT_FAMILIES),
        help="comma-separated families; the first also gets the training-step measurement "
        f"(default: {','.join(DEFAULT_FAMILIES)}; also {EDIT}, slow: 4,096 reference tokens)",
    )
    parser.add_argument("--steps", type=int, default=10, help="sampling steps (default: 10)")
    parser.add_argument("--batch", type=int, default=8, help="rollout batch (default: 8)")
    parser.add_argument(
        "--group-size",
        type=int,
        default=4,
        help="samples per prompt; the pipe gets num_images_per_prompt=group (default: 4)",
    )
    parser.add_argument("--guidance", type=float, default=4.5, help="CFG scale (default: 4.5)")
    parser.add_argument("--height", type=int, default=64, help="image height (default: 64)")
    parser.add_argument("--width", type=int, default=64, help="image width (default: 64)")
    parser.add_argument("--noise-level", type=float, default=0.7, help="SDE noise (default: 0.7)")
    parser.add_argument(
        "--repeats", type=int, default=15, help="timed rollouts of each method (default: 15)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed rollouts (default: 2)")
    parser.add_argument(
        "--minibatch", type=int, default=8, help="transitions per training step (default: 8)"
    )
    parser.add_argument(
        "--train-repeats", type=int, default=7, help="timed training steps each (default: 7)"
    )
    parser.add_argument("--lora-rank", type=int, default=32, help="LoRA rank (default: 32)")
    parser.add_argument("--lora-alpha", type=float, default=64.0, help="LoRA alpha (default: 64)")
    parser.add_argument(
        "--kl-beta",
        type=float,
        default=0.0,
        help="KL weight of the training loss; > 0 adds the reference forward (default: 0)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="float32",
        help="frozen-weight dtype; not float32 runs both paths under autocast (default: float32)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="always run the per-phase profile (it runs by itself when the target is missed)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 3 repeats, 1 warm-up, 2 training steps"
    )
    args = parser.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    if args.quick:
        for name, value in (("--repeats", 3), ("--warmup", 1), ("--train-repeats", 2)):
            if name not in given:
                setattr(args, name.lstrip("-").replace("-", "_"), value)
    if min(args.steps, args.batch, args.group_size, args.repeats, args.minibatch) < 1:
        parser.error("--steps, --batch, --group-size, --repeats and --minibatch must be >= 1")
    args.families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = sorted(set(args.families) - set(FAMILY_NAMES))
    if unknown or not args.families:
        parser.error(f"--families: unknown {unknown}; choose from {', '.join(FAMILY_NAMES)}")
    if args.batch % args.group_size:
        parser.error("--batch must be a multiple of --group-size")
    if args.train_repeats < 1 or args.warmup < 0:
        parser.error("--train-repeats must be >= 1 and --warmup >= 0")
    return args


# -- set-up ------------------------------------------------------------------------------------
def build_config(args: argparse.Namespace, num_prompts: int, family: str) -> TrainConfig:
    return TrainConfig(
        recipe="diffusers_overhead",
        seed=args.seed,
        policy=PolicyConfig(name=family, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha),
        sampler=SDESamplingConfig(
            num_steps=args.steps,
            noise_level=args.noise_level,
            guidance_scale=sampler_guidance(family, args.guidance),
        ),
        algorithm=FlowGRPOConfig(kl_beta=args.kl_beta),
        train=TrainLoopConfig(
            prompts_per_iteration=num_prompts,
            group_size=args.group_size,
            minibatch_size=args.minibatch,
        ),
    )


def adapter_kwargs(family: str, args: argparse.Namespace) -> dict[str, Any]:
    """The family's adapter keywords (tests/family_table), with a guidance embedding (FLUX.2
    [dev]) set to ``--guidance`` as the stock call's ``guidance_scale`` sets it."""
    from family_table import FAMILIES

    if family == EDIT:
        return {}
    description = FAMILIES[family]
    embedded = {"embedded_guidance": args.guidance} if description.embedded_guidance else {}
    return {**description.policy, **embedded}


def sampler_guidance(family: str, guidance: float) -> float:
    from family_table import sampler_guidance as table_guidance

    return guidance if family == EDIT else table_guidance(family, guidance)


def build_family(family: str, directory: Path) -> Path:
    """The family's tiny random pipeline, saved under ``directory``."""
    from diffusers_tiny_families import build_qwenimage_edit
    from family_table import FAMILIES

    return build_qwenimage_edit(directory) if family == EDIT else FAMILIES[family].build(directory)


def reference_image(index: int) -> Any:
    """A seeded random picture as an edit's reference image (as tests/test_qwenimage_edit.py)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(index).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def family_prompts(
    family: str, unique: list[str], group_size: int
) -> tuple[list[Any], list[Any], torch.Tensor]:
    """The distinct prompts and the training batch; Qwen-Image-Edit's carry a reference image."""
    from tasks.prompt import Prompt

    if family != EDIT:
        expanded, group_ids = expand_groups(unique, group_size)
        return unique, expanded, group_ids
    edits = [Prompt(text, {"images": [reference_image(i)]}) for i, text in enumerate(unique)]
    return (
        edits,
        [p for p in edits for _ in range(group_size)],
        torch.arange(len(edits)).repeat_interleave(group_size),
    )


# -- (a) rollouts ------------------------------------------------------------------------------
def stock_kwargs(family: str, guidance: float) -> dict[str, Any]:
    """The stock call's settings equal to the adapter's, CFG included (tests/family_table)."""
    from family_table import CALL_ONLY, FAMILIES

    description = FAMILIES[family]
    return {**description.call, **CALL_ONLY.get(family, {}), **description.stock_cfg(guidance)}


def stock_calls(family: str, unique: list[Any], guidance: float) -> list[dict[str, Any]]:
    """The stock pipeline's per-call arguments for one rollout of ``unique``: one call for the
    batch, or, for Qwen-Image-Edit, one per prompt with its reference image (its documented
    use; CFG is ``true_cfg_scale`` with a negative prompt)."""
    from family_table import true_cfg

    if family == EDIT:
        cfg = true_cfg(guidance)
        return [{"image": p.columns["images"][0], "prompt": str(p), **cfg} for p in unique]
    stock = stock_kwargs(family, guidance)
    if isinstance(stock.get("negative_prompt"), str):
        # One per prompt: FLUX and QwenImage repeat a single negative prompt only
        # num_images_per_prompt times, not once per prompt.
        stock["negative_prompt"] = [stock["negative_prompt"]] * len(unique)
    return [{"prompt": list(unique), **stock}]


def pipe_rollout(
    pipe: Any, unique: list[Any], args: argparse.Namespace, device: torch.device, family: str
) -> Callable[[int], torch.Tensor]:
    """Plain ``pipe(...)`` calls on the same prompts (``stock_calls``), returning latents."""
    calls = stock_calls(family, unique, args.guidance)

    def run(iteration: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + iteration)
        parts = []
        with torch.no_grad(), autocast(device, args.dtype):
            for call in calls:
                prompt = call["prompt"]  # a copy: ZImagePipeline templates its list in place
                parts.append(
                    pipe(
                        **{**call, "prompt": list(prompt) if isinstance(prompt, list) else prompt},
                        num_images_per_prompt=args.group_size,
                        num_inference_steps=args.steps,
                        height=args.height,
                        width=args.width,
                        generator=generator,
                        output_type="latent",
                    ).images
                )
        latents = parts[0] if len(parts) == 1 else torch.cat(parts)
        synchronize(device)
        return latents

    return run


# -- (b) training steps ------------------------------------------------------------------------
def training_minibatch(
    pair: tuple[FlowSDERollout, Any],
    policy: Any,
    prompts: list[str],
    group_ids: torch.Tensor,
    args: argparse.Namespace,
    device: torch.device,
) -> Any:
    """``--minibatch`` transitions of one rollout, shuffled as the updater does, with random
    advantages (zero advantages would make the policy-loss gradient vanish)."""
    noise = RolloutNoise(args.seed, 99_999, num_global=len(prompts), local=slice(0, len(prompts)))
    sde_rollout, objective = pair
    policy.module.eval()
    with torch.no_grad(), autocast(device, args.dtype):
        rollout = sde_rollout.collect(policy, prompts, group_ids, noise)
    generator = torch.Generator().manual_seed(args.seed)
    rollout.advantages = torch.randn(len(prompts), generator=generator).to(device)
    with torch.no_grad():
        units = objective.units(policy, rollout, noise)
    order = noise.local_permutation((Streams.MINIBATCH_ORDER, 0), len(units))
    if args.minibatch > len(units):
        raise SystemExit(
            f"--minibatch {args.minibatch} exceeds the {len(units)} transitions of one rollout"
        )
    return units.select(order[: args.minibatch].to(device))


def train_step(
    objective: Any,
    policy: Any,
    optimizer: torch.optim.Optimizer,
    minibatch: Any,
    args: argparse.Namespace,
    device: torch.device,
) -> float:
    """One optimizer step as ``genrl.loop.optimization.Updater`` takes it; returns the grad norm."""
    policy.module.train()
    with autocast(device, args.dtype):
        loss, _ = objective.loss(policy, minibatch)
        loss.backward()
    params = policy.trainable_parameters()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    if not torch.isfinite(loss.detach()):
        raise RuntimeError("non-finite training loss")
    return grad_norm


def measure_training(
    setups: dict[str, tuple[Any, Any, torch.optim.Optimizer]],
    minibatch: Any,
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, dict[str, float | None]]:
    """Median step time and peak memory of each setup, interleaved after one warm-up step."""
    names = list(setups)
    times: dict[str, list[float]] = {name: [] for name in names}
    peak: dict[str, float | None] = {name: None for name in names}
    first_grad_norm: dict[str, float] = {}
    for r in range(1 + args.train_repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            objective, policy, optimizer = setups[name]
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            grad_norm = train_step(objective, policy, optimizer, minibatch, args, device)
            elapsed = time.perf_counter() - start
            if r == 0:
                first_grad_norm[name] = grad_norm
            else:
                times[name].append(elapsed)
            if device.type == "cuda":
                peak[name] = torch.cuda.max_memory_allocated(device) / 2**30
    return {
        name: {
            "median_s": statistics.median(times[name]),
            "peak_memory_gib": peak[name],
            "first_step_grad_norm": first_grad_norm[name],
        }
        for name in names
    }


# -- main --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    wall_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    quiet_libraries()  # and tests/ on the path
    import diffusers
    import peft

    first = args.families[0]
    with tempfile.TemporaryDirectory(prefix="genrl-bench-") as tmp:
        dirs = {name: build_family(name, Path(tmp) / name) for name in args.families}
        policies = {
            name: build_trained_policy(name, dirs[name], args, device, **adapter_kwargs(name, args))
            for name in args.families
        }
        ckpt = build_trained_policy(
            first, dirs[first], args, device, checkpointing=True, **adapter_kwargs(first, args)
        )
    plain = policies[first]

    texts, _, _ = make_prompts(args.batch, args.group_size)
    batches = {name: family_prompts(name, texts, args.group_size) for name in args.families}
    unique, prompts, group_ids = batches[first]
    group_ids = group_ids.to(device)
    transformer = plain.pipe.transformer
    num_params = sum(p.numel() for n, p in transformer.named_parameters() if "lora_" not in n)
    num_trainable = sum(p.numel() for p in plain.trainable_parameters())

    # (a) rollouts: ours with log-probs vs the stock pipe call, family by family.
    results = {
        name: compare_rollouts(
            name,
            policy,
            batches[name][0],
            batches[name][1],
            batches[name][2].to(device),
            args,
            device,
        )
        for name, policy in policies.items()
    }
    config = build_config(args, len(unique), first)
    pairs = {
        "plain": results[first]["pair"],
        "ckpt": FlowGRPO(config.algorithm, config).build(ckpt),
    }
    median, times = results[first]["median"], results[first]["times"]
    ratio, paired = results[first]["ratio"], results[first]["paired"]
    meets, profile = ratio <= TARGET_RATIO, results[first]["profile"]
    by_family = {name: round(r["ratio"], 4) for name, r in results.items()}

    # (b) training steps with and without gradient checkpointing, same minibatch and weights.
    minibatch = training_minibatch(pairs["plain"], plain, prompts, group_ids, args, device)
    setups = {}
    for name, policy in (("plain", plain), ("ckpt", ckpt)):
        optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-4, weight_decay=1e-4)
        setups[name] = (pairs[name][1], policy, optimizer)
    training = measure_training(setups, minibatch, args, device)
    train_ratio = training["ckpt"]["median_s"] / training["plain"]["median_s"]

    print_report(args, median, times, ratio, paired, meets, training, train_ratio, profile)
    print_families(results, args)
    summary = {
        "benchmark": "diffusers_overhead",
        "rollout_over_pipe_time_ratio": round(ratio, 4),
        "rollout_over_pipe_time_ratio_by_family": by_family,
        "max_rollout_over_pipe_time_ratio": max(by_family.values()),
        "families_meeting_target": sorted(n for n, r in by_family.items() if r <= TARGET_RATIO),
        "headline_family": first,
        "paired_ratio_median": round(paired, 4),
        "target_ratio": TARGET_RATIO,
        "meets_target": meets,
        "ours_samples_per_s": round(args.batch / median["ours"], 3),
        "pipe_samples_per_s": round(args.batch / median["pipe"], 3),
        "ours_median_ms": round(median["ours"] * 1e3, 3),
        "pipe_median_ms": round(median["pipe"] * 1e3, 3),
        "train_step_s_no_checkpointing": round(training["plain"]["median_s"], 5),
        "train_step_s_checkpointing": round(training["ckpt"]["median_s"], 5),
        "checkpointing_over_plain_train_time_ratio": round(train_ratio, 4),
        "peak_memory_gib_no_checkpointing": _round(training["plain"]["peak_memory_gib"]),
        "peak_memory_gib_checkpointing": _round(training["ckpt"]["peak_memory_gib"]),
        "first_step_grad_norm_no_checkpointing": training["plain"]["first_step_grad_norm"],
        "first_step_grad_norm_checkpointing": training["ckpt"]["first_step_grad_norm"],
        "checkpointing_enabled": bool(ckpt.pipe.transformer.gradient_checkpointing),
        "phases_ms": profile,
        "model": f"tiny random {plain.pipeline_class} (tests/family_table.FAMILIES[{first!r}])",
        "transformer_parameters": num_params,
        "trainable_parameters": num_trainable,
        "steps": args.steps,
        "batch": args.batch,
        "group_size": args.group_size,
        "guidance_scale": args.guidance,
        "height": args.height,
        "width": args.width,
        "latent_shape": list(plain.latent_shape),
        "noise_level": args.noise_level,
        "minibatch": args.minibatch,
        "kl_beta": args.kl_beta,
        "lora_rank": args.lora_rank,
        "lora_alpha": args.lora_alpha,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "train_repeats": args.train_repeats,
        "quick": args.quick,
        "device": str(device),
        "dtype": args.dtype,
        "num_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "diffusers_version": diffusers.__version__,
        "peft_version": peft.__version__,
        "wall_seconds": round(time.perf_counter() - wall_start, 2),
    }
    print(json.dumps(summary))


def compare_rollouts(
    family: str,
    policy: Any,
    unique: list[str],
    prompts: list[str],
    group_ids: torch.Tensor,
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, Any]:
    """Our Flow-GRPO rollout against the stock call for one family, interleaved; profiled by
    phase when it misses the target (or with ``--profile``)."""
    config = build_config(args, len(unique), family)
    pair = FlowGRPO(config.algorithm, config).build(policy)
    methods = {
        "pipe": pipe_rollout(policy.pipe, unique, args, device, family),
        "ours": ours_rollout(pair[0], policy, prompts, group_ids, args, device),
    }
    times = time_interleaved(methods, args.repeats, args.warmup)
    median = {name: statistics.median(values) for name, values in times.items()}
    ratio = median["ours"] / median["pipe"]
    paired = statistics.median(o / p for o, p in zip(times["ours"], times["pipe"], strict=True))
    profile = None
    if args.profile or ratio > TARGET_RATIO:
        rollout = pair[0]
        profile = profile_phases(
            rollout,
            policy,
            lambda instrument: ours_rollout(
                rollout, policy, prompts, group_ids, args, device, instrument
            ),
            pipe_rollout(policy.pipe, unique, args, device, family),
            max(3, args.repeats // 2),
            device,
        )
    return {"pair": pair, "times": times, "median": median, "ratio": ratio, "paired": paired,
            "profile": profile}  # fmt: skip


def print_families(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"Rollout time ratio ours / pipe by family (target <= {TARGET_RATIO}):")
    for name, r in results.items():
        ms = {k: 1e3 * v for k, v in r["median"].items()}
        print(
            f"  {name:<10} ours {ms['ours']:8.1f} ms  pipe {ms['pipe']:8.1f} ms  "
            f"ratio {r['ratio']:.3f}  paired {r['paired']:.3f}"
        )


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def print_report(
    args: argparse.Namespace,
    median: dict[str, float],
    times: dict[str, list[float]],
    ratio: float,
    paired: float,
    meets: bool,
    training: dict[str, dict[str, float | None]],
    train_ratio: float,
    profile: dict[str, dict[str, float]] | None,
) -> None:
    print(
        f"Tiny {args.families[0]} at {args.height}x{args.width}, {args.steps} steps, batch {args.batch} "
        f"({args.batch // args.group_size} prompts x {args.group_size}), guidance {args.guidance}, "
        f"{args.dtype} on {args.device}, LoRA r{args.lora_rank}"
    )
    print(f"(a) Rollout, median of {args.repeats} interleaved repeats:")
    print_rollout_table(times, median, args.batch, "samples", ratio, paired, TARGET_RATIO, profile)
    print(f"(b) Training step ({args.minibatch} transitions, CFG, backward, AdamW):")
    header = f"{'gradient checkpointing':<24}  {'median s':>9}  {'peak GiB':>8}  {'grad norm':>10}"
    print(header)
    print("-" * len(header))
    for name, label in (("plain", "off"), ("ckpt", "on")):
        row = training[name]
        peak = "-" if row["peak_memory_gib"] is None else f"{row['peak_memory_gib']:.3f}"
        print(
            f"{label:<24}  {row['median_s']:>9.4f}  {peak:>8}  {row['first_step_grad_norm']:>10.4g}"
        )
    print(f"checkpointing on/off time ratio {train_ratio:.3f}")


if __name__ == "__main__":
    main()
