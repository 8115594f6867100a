"""Overhead of our Wan text-to-video adapter against the stock ``WanPipeline``, on a tiny random
Wan pipeline, and peak memory per frame count.

Everything runs on one pipeline built into a temporary directory with
``tests/diffusers_tiny.build_wan`` and loaded through ``pipelines.build_policy("wan", ...)`` with
LoRA set up as the trainer does:

(a) Rollout time. Ours is exactly what a training rollout runs,
    ``FlowSDERollout.collect(policy, prompts, group_ids, RolloutNoise(...))``: prompt encoding (each
    distinct prompt once), an SDE step with its log-prob at every step (``--sampler``:
    ``flow_sde_linear`` at noise 1.0 by default, Flow-GRPO's Wan SDE), and stacking every state
    and log-prob. The baseline is a plain ``pipe(prompt=..., num_videos_per_prompt=group, ...,
    output_type="latent")`` call on the same pipeline object (same transformer, LoRA layers
    included), which encodes its prompts and negative prompt on every call. Same steps, batch,
    guidance, frames, size, text length and dtype/autocast. One difference is by design:
    ``WanPipeline`` runs classifier-free guidance as two transformer forwards per step (cond, then
    uncond), where ours batches cond and uncond into one forward of twice the batch. The two are
    interleaved (alternating order) after warm-ups and compared by their median times; when the
    ratio misses the target (or with ``--profile``) both are re-run with per-phase timers.
(b) Decode time: ours (``decode_in_chunks(policy, latents, --decode-chunk)``, as a rollout turns
    its final latents into videos with ``train.rollout_batch_size``) against the pipeline's own
    decode path (the lines of ``WanPipeline.__call__`` after the loop: un-normalise, one
    ``vae.decode`` of the whole batch, ``video_processor.postprocess_video(output_type="pt")``),
    interleaved, on the same latents.
(c) Peak memory per frame count (``--memory-frames``): for each, a fresh subprocess loads the
    policy and measures one rollout (ours and the pipe's) and one decode of the batch (ours and
    the pipe's). Each measurement follows one untimed warm-up call of the same shapes, so that
    one-time initialisation is not counted. On CUDA: ``torch.cuda.max_memory_allocated`` minus
    the memory allocated before the call, after ``reset_peak_memory_stats``. On CPU: growth of
    the process's peak resident set size (``VmHWM`` in ``/proc/self/status``, reset to the
    current RSS before the call by writing 5 to ``/proc/self/clear_refs``) over the RSS before
    the call. So that memory freed by the warm-up and kept by the C heap is not reused unseen,
    the subprocess runs with glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed at 16 KiB (every larger
    tensor buffer is its own mapping, returned to the system when freed) and calls
    ``malloc_trim(0)`` before each measurement (free heap pages go back too). Checked by hand:
    a 9.54 MB tensor reads 9.54 MB, 2000 tensors of 4 KB read 8.2 MB. The CPU figures include
    allocator and Python-object overhead and the call's output; linux with glibc only. Python's
    ``tracemalloc`` does not see torch's CPU allocations, so it cannot be used. On the tiny
    model a rollout's peak is mostly the text: UMT5's attention over ``--max-sequence-length``
    tokens (512, about 14 MB) dwarfs the latents (``--max-sequence-length 16`` shows the part
    that grows with the frames: the stored trajectory on our side).
(d) The other video families (``--families``: LTX-Video, HunyuanVideo 1.5, Wan 2.2 A14B), each
    on its own tiny pipeline: rollout time as in (a), ours over the stock call
    (``benchmarks/video_families.py``; target <= 1.15 each).

Usage::

    python benchmarks/video_overhead.py                  # CPU, float32, 1 thread
    python benchmarks/video_overhead.py --quick          # smoke run
    python benchmarks/video_overhead.py --device cuda --dtype bfloat16

The last line of output is one JSON object (benchmarks/README.md); its headline
``rollout_over_pipe_time_ratio`` is ours / pipe median rollout time (target: <= 1.1), and
``peak_memory_mb_by_frames`` maps each frame count to ``{"rollout": MB, "decode": MB, ...}``;
``rollout_over_pipe_time_ratio_by_family`` holds (d).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from flow_pipes import (
    Run,
    build_trained_policy,
    make_prompts,
    ours_rollout,
    print_rollout_table,
    profile_phases,
    quiet_libraries,
)
from timing import DTYPES, autocast, synchronize, time_interleaved
from video_families import FAMILY_TARGET_RATIO, VIDEO_FAMILIES, family_ratios

from genrl.algorithms.flow_grpo import FlowGRPO, FlowGRPOConfig
from genrl.rollouts.flow import decode_in_chunks
from genrl.rollouts.flow_sde import FlowSDERollout
from genrl.run.config import PolicyConfig, SDESamplingConfig, TrainConfig, TrainLoopConfig

TARGET_RATIO = 1.1
MMAP_THRESHOLD = 16 * 1024  # bytes; see the module docstring, (c)
SAMPLERS = ("flow_sde_linear", "flow_sde", "dance_sde", "flow_cps")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="sampling steps (default: 10)")
    parser.add_argument("--batch", type=int, default=8, help="rollout batch (default: 8)")
    parser.add_argument(
        "--group-size",
        type=int,
        default=4,
        help="videos per prompt; the pipe gets num_videos_per_prompt=group (default: 4)",
    )
    parser.add_argument("--guidance", type=float, default=4.5, help="CFG scale (default: 4.5)")
    parser.add_argument("--height", type=int, default=64, help="video height (default: 64)")
    parser.add_argument("--width", type=int, default=64, help="video width (default: 64)")
    parser.add_argument("--frames", type=int, default=9, help="frames per video (default: 9)")
    parser.add_argument(
        "--max-sequence-length",
        type=int,
        default=512,
        help="UMT5 tokens per prompt, both paths (default: 512, WanPipeline's)",
    )
    parser.add_argument(
        "--sampler", choices=SAMPLERS, default="flow_sde_linear", help="SDE (default: %(default)s)"
    )
    parser.add_argument("--noise-level", type=float, default=1.0, help="SDE noise (default: 1.0)")
    parser.add_argument(
        "--repeats", type=int, default=15, help="timed rollouts of each method (default: 15)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed rollouts (default: 2)")
    parser.add_argument(
        "--decode-chunk",
        type=int,
        default=4,
        help="videos per VAE decode on our side, train.rollout_batch_size (default: 4; 0: all)",
    )
    parser.add_argument(
        "--decode-repeats", type=int, default=7, help="timed decodes of each (default: 7)"
    )
    parser.add_argument(
        "--memory-frames",
        default="1,5,9,17,33",
        help="comma-separated frame counts for the peak-memory table ('' skips it)",
    )
    parser.add_argument("--lora-rank", type=int, default=32, help="LoRA rank (default: 32)")
    parser.add_argument("--lora-alpha", type=float, default=64.0, help="LoRA alpha (default: 64)")
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
        "--quick",
        action="store_true",
        help="smoke run: 3 repeats, 1 warm-up, 2 decodes, memory at 1 and 5 frames",
    )
    # Internal: one peak-memory measurement in this (fresh) process; prints one JSON line.
    parser.add_argument(
        "--families",
        default=",".join(VIDEO_FAMILIES),
        help=f"other video families for (d), comma-separated from {', '.join(VIDEO_FAMILIES)} "
        "(default: all; '' for none)",
    )
    parser.add_argument("--memory-worker", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    if args.quick:
        quick = (("--repeats", 3), ("--warmup", 1), ("--decode-repeats", 2))
        for name, value in (*quick, ("--memory-frames", "1,5")):
            if name not in given:
                setattr(args, name.lstrip("-").replace("-", "_"), value)
    if min(args.steps, args.batch, args.group_size, args.repeats, args.decode_repeats) < 1:
        parser.error("--steps, --batch, --group-size, --repeats, --decode-repeats must be >= 1")
    if args.batch % args.group_size:
        parser.error("--batch must be a multiple of --group-size")
    if args.warmup < 0 or args.decode_chunk < 0:
        parser.error("--warmup and --decode-chunk must be >= 0")
    args.families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = sorted(set(args.families) - set(VIDEO_FAMILIES))
    if unknown:
        parser.error(f"--families: unknown {', '.join(unknown)}; from {', '.join(VIDEO_FAMILIES)}")
    try:
        args.memory_frames = [int(f) for f in args.memory_frames.split(",") if f.strip()]
    except ValueError:
        parser.error("--memory-frames takes comma-separated integers, e.g. 1,5,9")
    return args


# -- set-up ------------------------------------------------------------------------------------
def build_config(args: argparse.Namespace, num_prompts: int) -> TrainConfig:
    return TrainConfig(
        recipe="video_overhead",
        seed=args.seed,
        policy=PolicyConfig(name="wan", lora_rank=args.lora_rank, lora_alpha=args.lora_alpha),
        sampler=SDESamplingConfig(
            name=args.sampler,
            num_steps=args.steps,
            noise_level=args.noise_level,
            guidance_scale=args.guidance,
        ),
        algorithm=FlowGRPOConfig(),
        train=TrainLoopConfig(
            prompts_per_iteration=num_prompts,
            group_size=args.group_size,
            minibatch_size=args.batch,
            rollout_batch_size=args.decode_chunk,
        ),
    )


def load_policy(
    directory: Path, args: argparse.Namespace, device: torch.device, frames: int
) -> Any:
    return build_trained_policy(
        "wan",
        directory,
        args,
        device,
        num_frames=frames,
        max_sequence_length=args.max_sequence_length,
    )


def rollout_for(policy: Any, args: argparse.Namespace, num_prompts: int) -> FlowSDERollout:
    config = build_config(args, num_prompts)
    rollout, _ = FlowGRPO(config.algorithm, config).build(policy)
    return rollout


# -- (a) rollouts and (b) decodes --------------------------------------------------------------
def pipe_rollout(
    pipe: Any, unique: list[str], args: argparse.Namespace, device: torch.device, frames: int
) -> Run:
    """A plain ``WanPipeline.__call__`` on the same prompts, returning latents."""

    def run(iteration: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + iteration)
        with torch.no_grad(), autocast(device, args.dtype):
            latents = pipe(
                prompt=unique,
                num_videos_per_prompt=args.group_size,
                num_inference_steps=args.steps,
                guidance_scale=args.guidance,
                height=args.height,
                width=args.width,
                num_frames=frames,
                max_sequence_length=args.max_sequence_length,
                generator=generator,
                output_type="latent",
            ).frames
        synchronize(device)
        return latents

    return run


def ours_decode(policy: Any, latents: torch.Tensor, chunk: int, device: torch.device) -> Run:
    """Videos ``[B, F, 3, H, W]`` in [0, 1] as a rollout's ``outputs`` makes them."""

    def run(iteration: int) -> torch.Tensor:
        video = decode_in_chunks(policy, latents, chunk)
        synchronize(device)
        return video

    return run


def pipe_decode(pipe: Any, latents: torch.Tensor, device: torch.device) -> Run:
    """The decode lines of ``WanPipeline.__call__`` (diffusers 0.3x-0.4x) for
    ``output_type="pt"``: the whole batch in one ``vae.decode``."""
    vae = pipe.vae

    def run(iteration: int) -> torch.Tensor:
        with torch.no_grad():
            z = latents.to(vae.device, vae.dtype)
            shape = (1, vae.config.z_dim, 1, 1, 1)
            mean = torch.tensor(vae.config.latents_mean).view(shape).to(z.device, z.dtype)
            inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(z.device, z.dtype)
            video = vae.decode(z / inv_std + mean, return_dict=False)[0]
            video = pipe.video_processor.postprocess_video(video, output_type="pt")
        synchronize(device)
        return video

    return run


# -- (c) peak memory ---------------------------------------------------------------------------
def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        match = re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(match.group(1))


def peak_mb(run: Run, device: torch.device) -> float:
    """Peak memory of one ``run(0)`` call above what was in use before it, in MB (2**20 bytes),
    after one warm-up call. See the module docstring, (c)."""
    run(0)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = run(1)
        peak = torch.cuda.max_memory_allocated(device) - before
        del out
        return peak / 2**20
    # Hand freed heap pages back to the system, so that reusing them counts again.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # peak RSS := current RSS (Linux >= 4.0)
    before = _status_kb("VmRSS")
    out = run(1)
    peak = _status_kb("VmHWM") - before
    del out
    return peak / 1024


def memory_worker(args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    """Peak memory of one rollout and one decode, ours and the pipe's, at ``args.frames``."""
    directory = Path(args.memory_worker)
    policy = load_policy(directory, args, device, args.frames)
    unique, prompts, group_ids = make_prompts(args.batch, args.group_size)
    group_ids = group_ids.to(device)
    rollout = rollout_for(policy, args, len(unique))
    ours = ours_rollout(rollout, policy, prompts, group_ids, args, device)
    result = {"rollout": peak_mb(ours, device)}
    result["pipe_rollout"] = peak_mb(
        pipe_rollout(policy.pipe, unique, args, device, args.frames), device
    )
    latents = ours(2)
    result["decode"] = peak_mb(ours_decode(policy, latents, args.decode_chunk, device), device)
    result["pipe_decode"] = peak_mb(pipe_decode(policy.pipe, latents, device), device)
    return {k: round(v, 2) for k, v in result.items()}


def measure_memory(
    directory: Path, args: argparse.Namespace, argv: list[str]
) -> dict[str, dict[str, float]]:
    """One fresh subprocess per frame count (``--memory-worker``)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    out: dict[str, dict[str, float]] = {}
    for frames in args.memory_frames:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            *argv,
            "--frames",
            str(frames),
            "--memory-worker",
            str(directory),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"memory worker at {frames} frames failed:\n{done.stderr[-3000:]}")
        out[str(frames)] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


# -- main --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    given = list(argv if argv is not None else sys.argv[1:])
    args = parse_args(given)
    wall_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    quiet_libraries()  # and tests/ on the path
    if args.memory_worker:
        print(json.dumps(memory_worker(args, device)))
        return
    import diffusers
    import peft
    from diffusers_tiny import build_wan

    with tempfile.TemporaryDirectory(prefix="genrl-bench-") as tmp:
        directory = build_wan(Path(tmp) / "wan")
        policy = load_policy(directory, args, device, args.frames)

        unique, prompts, group_ids = make_prompts(args.batch, args.group_size)
        group_ids = group_ids.to(device)
        rollout = rollout_for(policy, args, len(unique))
        transformer = policy.pipe.transformer
        num_params = sum(p.numel() for n, p in transformer.named_parameters() if "lora_" not in n)

        # (a) rollouts: ours with log-probs vs the stock pipe call.
        methods = {
            "pipe": pipe_rollout(policy.pipe, unique, args, device, args.frames),
            "ours": ours_rollout(rollout, policy, prompts, group_ids, args, device),
        }
        times = time_interleaved(methods, args.repeats, args.warmup)
        median = {name: statistics.median(values) for name, values in times.items()}
        ratio = median["ours"] / median["pipe"]
        paired = statistics.median(o / p for o, p in zip(times["ours"], times["pipe"], strict=True))
        meets = ratio <= TARGET_RATIO
        profile = None
        if args.profile or not meets:
            profile = profile_phases(
                rollout,
                policy,
                lambda instrument: ours_rollout(
                    rollout, policy, prompts, group_ids, args, device, instrument
                ),
                methods["pipe"],
                max(3, args.repeats // 2),
                device,
            )

        # (b) decodes of one rollout's final latents.
        latents = methods["ours"](0)
        decoders = {
            "pipe": pipe_decode(policy.pipe, latents, device),
            "ours": ours_decode(policy, latents, args.decode_chunk, device),
        }
        decode_diff = float((decoders["ours"](0) - decoders["pipe"](0)).abs().max())
        decode_times = time_interleaved(decoders, args.decode_repeats, 1)
        decode_median = {name: statistics.median(v) for name, v in decode_times.items()}

        # (c) peak memory per frame count, each in a fresh process.
        worker_argv = [a for a in _strip_frames(given) if a not in ("--profile", "--quick")]
        linux = os.path.exists("/proc/self/clear_refs")
        if args.memory_frames and (device.type == "cuda" or linux):
            memory = measure_memory(directory, args, worker_argv)
        else:
            memory = {}  # CPU peak memory needs Linux's /proc/self/clear_refs

        # (d) the other video families' rollouts against their stock calls.
        by_family = family_ratios(args.families, Path(tmp), args, device, rollout_for)

    memory_method = (
        "torch.cuda.max_memory_allocated above the allocation before the call"
        if device.type == "cuda"
        else "peak RSS growth (VmHWM after /proc/self/clear_refs reset, minus VmRSS before), "
        f"fresh process per frame count, MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}, malloc_trim"
    )
    print_report(args, median, times, ratio, paired, meets, profile, decode_median, memory)
    summary = {
        "benchmark": "video_overhead",
        "rollout_over_pipe_time_ratio": round(ratio, 4),
        "paired_ratio_median": round(paired, 4),
        "target_ratio": TARGET_RATIO,
        "meets_target": meets,
        "ours_median_ms": round(median["ours"] * 1e3, 3),
        "pipe_median_ms": round(median["pipe"] * 1e3, 3),
        "ours_videos_per_s": round(args.batch / median["ours"], 3),
        "pipe_videos_per_s": round(args.batch / median["pipe"], 3),
        "phases_ms": profile,
        "decode_ours_median_ms": round(decode_median["ours"] * 1e3, 3),
        "decode_pipe_median_ms": round(decode_median["pipe"] * 1e3, 3),
        "decode_ours_over_pipe_time_ratio": round(decode_median["ours"] / decode_median["pipe"], 4),
        "decode_max_abs_difference": decode_diff,
        "peak_memory_mb_by_frames": memory,
        "rollout_over_pipe_time_ratio_by_family": {
            family: row["rollout_over_pipe_time_ratio"] for family, row in by_family.items()
        },
        "family_median_ms": by_family,
        "family_target_ratio": FAMILY_TARGET_RATIO,
        "families_meet_target": all(
            row["rollout_over_pipe_time_ratio"] <= FAMILY_TARGET_RATIO for row in by_family.values()
        ),
        "peak_memory_method": memory_method,
        "model": "tiny random WanPipeline (tests/diffusers_tiny.build_wan)",
        "transformer_parameters": num_params,
        "trainable_parameters": sum(p.numel() for p in policy.trainable_parameters()),
        "sampler": args.sampler,
        "noise_level": args.noise_level,
        "steps": args.steps,
        "batch": args.batch,
        "group_size": args.group_size,
        "guidance_scale": args.guidance,
        "frames": args.frames,
        "height": args.height,
        "width": args.width,
        "latent_shape": list(policy.latent_shape),
        "max_sequence_length": args.max_sequence_length,
        "decode_chunk": args.decode_chunk,
        "lora_rank": args.lora_rank,
        "lora_alpha": args.lora_alpha,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "decode_repeats": args.decode_repeats,
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


def _strip_frames(argv: list[str]) -> list[str]:
    """``argv`` without ``--frames N`` / ``--frames=N`` (the workers get their own)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--frames":
            skip = True
        elif not arg.startswith("--frames="):
            out.append(arg)
    return out


def print_report(
    args: argparse.Namespace,
    median: dict[str, float],
    times: dict[str, list[float]],
    ratio: float,
    paired: float,
    meets: bool,
    profile: dict[str, dict[str, float]] | None,
    decode_median: dict[str, float],
    memory: dict[str, dict[str, float]],
) -> None:
    print(
        f"Tiny Wan at {args.frames} frames of {args.height}x{args.width}, {args.steps} steps, "
        f"batch {args.batch} ({args.batch // args.group_size} prompts x {args.group_size}), "
        f"guidance {args.guidance}, {args.sampler} noise {args.noise_level}, text "
        f"{args.max_sequence_length} tokens, {args.dtype} on {args.device}, LoRA r{args.lora_rank}"
    )
    print(f"(a) Rollout, median of {args.repeats} interleaved repeats:")
    print_rollout_table(times, median, args.batch, "videos", ratio, paired, TARGET_RATIO, profile)
    chunk = args.decode_chunk or args.batch
    print(
        f"(b) Decode of {args.batch} videos, median of {args.decode_repeats}: ours ({chunk} at a "
        f"time) {decode_median['ours'] * 1e3:.1f} ms, pipe (all at once) "
        f"{decode_median['pipe'] * 1e3:.1f} ms, ratio "
        f"{decode_median['ours'] / decode_median['pipe']:.3f}"
    )
    if not memory:
        return
    print(f"(c) Peak memory in MB above the state before the call, batch {args.batch}:")
    header = (
        f"{'frames':>6}  {'rollout':>8}  {'pipe rollout':>12}  {'decode':>8}  {'pipe decode':>11}"
    )
    print(header)
    print("-" * len(header))
    for frames, row in memory.items():
        print(
            f"{frames:>6}  {row['rollout']:>8.1f}  {row['pipe_rollout']:>12.1f}  "
            f"{row['decode']:>8.1f}  {row['pipe_decode']:>11.1f}"
        )


if __name__ == "__main__":
    main()
