"""Part (d) of ``video_overhead.py``: our training rollout against the stock pipeline call for
the text-to-video families beyond Wan 2.1, each on its tiny random pipeline
(``tests/diffusers_tiny_video.py``): LTX-Video (``LTXPipeline``), HunyuanVideo 1.5
(``HunyuanVideo15Pipeline``) and Wan 2.2 A14B (``WanPipeline`` with ``transformer_2``).

As in part (a): ours is ``FlowSDERollout.collect`` (prompt encoding, an SDE step with its
log-prob at every step, CFG as one batched forward of cond and uncond), the baseline a plain
``pipe(..., output_type="latent")`` call on the same pipeline object with the same steps,
batch, guidance, frames, size and text length, interleaved, compared by their medians.
HunyuanVideo 1.5 takes CFG from its guider, which is set to the same scale; its pipeline reads
its prompt template and text lengths from attributes, set as ``tests/family_table.py`` does
(a short system prompt, ``--max-sequence-length`` prompt tokens, 16 ByT5 tokens, 4 image
tokens).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from flow_pipes import Run, build_trained_policy, make_prompts, ours_rollout
from timing import autocast, synchronize, time_interleaved

FAMILY_TARGET_RATIO = 1.15
VIDEO_FAMILIES = ("ltx", "hunyuan_video15", "wan_a14b")


def _builders() -> dict[str, tuple[str, Callable[[Path], Path]]]:
    from diffusers_tiny_video import build_hunyuan_video15, build_ltx, build_wan_a14b

    return {
        "ltx": ("ltx", build_ltx),
        "hunyuan_video15": ("hunyuan_video15", build_hunyuan_video15),
        "wan_a14b": ("wan", build_wan_a14b),
    }


def stock_rollout(
    family: str, pipe: Any, unique: list[str], args: argparse.Namespace, device: torch.device
) -> Run:
    """The family's plain ``pipe(...)`` call on the same prompts, returning latents."""
    hunyuan = family == "hunyuan_video15"
    text = {} if hunyuan else {"max_sequence_length": args.max_sequence_length}
    guidance = {} if hunyuan else {"guidance_scale": args.guidance}
    # HunyuanVideo15Pipeline (diffusers 0.42) makes its zero image embeddings for the prompts
    # alone, not per video, so it fails with num_videos_per_prompt > 1: it gets every video's
    # prompt instead (and encodes each, where ours encodes each distinct prompt once).
    prompts = [p for p in unique for _ in range(args.group_size)] if hunyuan else unique
    per_prompt = 1 if hunyuan else args.group_size

    def run(iteration: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + iteration)
        with torch.no_grad(), autocast(device, args.dtype):
            latents = pipe(
                prompt=prompts,
                num_videos_per_prompt=per_prompt,
                num_inference_steps=args.steps,
                height=args.height,
                width=args.width,
                num_frames=args.frames,
                generator=generator,
                output_type="latent",
                **guidance,
                **text,
            ).frames
        synchronize(device)
        return latents

    return run


def family_ratios(
    families: list[str],
    root: Path,
    args: argparse.Namespace,
    device: torch.device,
    rollout_for: Callable[[Any, argparse.Namespace, int], Any],
) -> dict[str, dict[str, float]]:
    """``{family: {"rollout_over_pipe_time_ratio", "ours_median_ms", "pipe_median_ms"}}``."""
    from family_table import configure_hunyuan

    builders = _builders()
    out: dict[str, dict[str, float]] = {}
    for family in families:
        name, build = builders[family]
        directory = build(root / family)
        policy = build_trained_policy(
            name,
            directory,
            args,
            device,
            num_frames=args.frames,
            max_sequence_length=args.max_sequence_length,
        )
        if family == "hunyuan_video15":
            configure_hunyuan(policy.pipe, args.guidance)
            policy.pipe.tokenizer_max_length = args.max_sequence_length
        unique, prompts, group_ids = make_prompts(args.batch, args.group_size)
        rollout = rollout_for(policy, args, len(unique))
        methods = {
            "pipe": stock_rollout(family, policy.pipe, unique, args, device),
            "ours": ours_rollout(rollout, policy, prompts, group_ids.to(device), args, device),
        }
        times = time_interleaved(methods, args.repeats, args.warmup)
        median = {key: statistics.median(values) for key, values in times.items()}
        out[family] = {
            "rollout_over_pipe_time_ratio": round(median["ours"] / median["pipe"], 4),
            "ours_median_ms": round(median["ours"] * 1e3, 3),
            "pipe_median_ms": round(median["pipe"] * 1e3, 3),
        }
        print(
            f"(d) {family}: ours {median['ours'] * 1e3:.1f} ms, pipe {median['pipe'] * 1e3:.1f} "
            f"ms, ratio {median['ours'] / median['pipe']:.3f} (target <= {FAMILY_TARGET_RATIO})"
        )
    return out
