"""Overhead of the DDIM rollout of the UNet adapters (SD, SDXL) against the stock pipelines, on
tiny random pipelines (``tests/diffusers_tiny_unet.py``).

Ours is exactly what a DDPO training rollout runs, ``DDIMRollout.collect(policy, prompts,
group_ids, RolloutNoise(...))``: prompt encoding (each distinct prompt once), CFG in one batched
forward, the stochastic DDIM step with its log-prob at every step, and the stored states and
log-probs. The baseline is ``pipe(prompt=..., num_images_per_prompt=group, num_inference_steps=...,
guidance_scale=..., eta=..., output_type="latent")`` on the same pipeline object (its DDIM
scheduler, the same UNet with the LoRA layers), which also encodes its prompts on every call.
Same steps, batch, guidance, eta and image size; the two are interleaved after warm-ups and
compared by their median times. (``diffusers_overhead.py`` measures the flow families the same
way; this file holds the UNet families, whose rollout and sampler differ.)

Usage::

    python benchmarks/ddim_overhead.py            # CPU, float32, 1 thread
    python benchmarks/ddim_overhead.py --quick    # smoke run

The last line is one JSON object: ``rollout_over_pipe_time_ratio_by_family`` (ours / pipe median
rollout time per family) and ``max_rollout_over_pipe_time_ratio`` (target: <= 1.1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from flow_pipes import make_prompts, quiet_libraries
from timing import time_interleaved

from genrl.algorithms.ddpo import DDPO, DDPOConfig
from genrl.data.rng import RolloutNoise
from genrl.run.config import DDIMSamplingConfig, PolicyConfig, TrainConfig, TrainLoopConfig

TARGET_RATIO = 1.1
FAMILIES = ("sd", "sdxl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="sd, sdxl or both")
    parser.add_argument("--steps", type=int, default=10, help="DDIM steps (default: 10)")
    parser.add_argument("--batch", type=int, default=8, help="rollout batch (default: 8)")
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt (4)")
    parser.add_argument("--guidance", type=float, default=5.0, help="CFG scale (default: 5)")
    parser.add_argument("--eta", type=float, default=1.0, help="DDIM eta (default: 1)")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels (64)")
    parser.add_argument("--repeats", type=int, default=15, help="timed rollouts each (15)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rollouts (2)")
    parser.add_argument("--lora-rank", type=int, default=4, help="LoRA rank (DDPO: 4)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    parser.add_argument("--quick", action="store_true", help="3 repeats, 1 warm-up")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.warmup = 3, 1
    args.families = [f.strip() for f in args.families.split(",") if f.strip()]
    if sorted(set(args.families) - set(FAMILIES)) or not args.families:
        parser.error(f"--families: choose from {', '.join(FAMILIES)}")
    if args.batch % args.group_size or min(args.steps, args.repeats) < 1:
        parser.error("--batch must be a multiple of --group-size; --steps, --repeats >= 1")
    return args


def measure(family: str, directory: Path, args: argparse.Namespace) -> float:
    from diffusers_tiny_unet import build_sd, build_sdxl

    from pipelines import build_policy

    path = (build_sd if family == "sd" else build_sdxl)(directory / family)
    policy = build_policy(family, pretrained=str(path), height=args.size, width=args.size)
    policy.setup_training(args.lora_rank, args.lora_rank, None)
    policy.pipe.set_progress_bar_config(disable=True)
    unique, prompts, group_ids = make_prompts(args.batch, args.group_size)
    config = TrainConfig(
        recipe="ddim_overhead",
        policy=PolicyConfig(name=family, lora_rank=args.lora_rank),
        sampler=DDIMSamplingConfig(
            num_steps=args.steps, noise_level=args.eta, guidance_scale=args.guidance
        ),
        algorithm=DDPOConfig(),
        train=TrainLoopConfig(
            prompts_per_iteration=len(unique), group_size=args.group_size, minibatch_size=8
        ),
    )
    rollout, _ = DDPO(config.algorithm, config).build(policy)
    policy.module.eval()

    def ours(iteration: int) -> torch.Tensor:
        noise = RolloutNoise(0, iteration, num_global=len(prompts), local=slice(0, len(prompts)))
        with torch.no_grad():
            return rollout.collect(policy, prompts, group_ids, noise).latents[:, -1]

    def pipe(iteration: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(iteration)
        return policy.pipe(
            prompt=unique,
            num_images_per_prompt=args.group_size,
            num_inference_steps=args.steps,
            guidance_scale=args.guidance,
            eta=args.eta,
            height=args.size,
            width=args.size,
            generator=generator,
            output_type="latent",
        ).images

    times = time_interleaved({"ours": ours, "pipe": pipe}, args.repeats, args.warmup)
    ratio = statistics.median(times["ours"]) / statistics.median(times["pipe"])
    print(
        f"{family:5s} ours {statistics.median(times['ours']) * 1e3:8.1f} ms  pipe "
        f"{statistics.median(times['pipe']) * 1e3:8.1f} ms  ratio {ratio:.3f}"
    )
    return ratio


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    quiet_libraries()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        ratios = {family: measure(family, Path(tmp), args) for family in args.families}
    worst = max(ratios.values())
    summary = {
        "rollout_over_pipe_time_ratio_by_family": {k: round(v, 4) for k, v in ratios.items()},
        "max_rollout_over_pipe_time_ratio": round(worst, 4),
        "target": TARGET_RATIO,
        "meets_target": worst <= TARGET_RATIO,
        "steps": args.steps,
        "batch": args.batch,
        "size": args.size,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
