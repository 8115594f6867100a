"""``genrl plan RECIPE``: what fits on how many GPUs, and how long a step takes
(``genrl/planning/``)."""

from __future__ import annotations

import argparse
import json
import resource
import sys
from typing import Any


def add_plan_parser(sub: Any, add_config_args: Any) -> None:
    plan = sub.add_parser(
        "plan",
        help="per-GPU memory of a recipe under DDP, FSDP2 and ZeRO, LoRA or full, with or "
        "without gradient checkpointing, and a step's FLOPs and time (no model is allocated)",
    )
    add_config_args(plan)
    plan.add_argument("--gpus", type=int, default=1, help="number of GPUs (default 1)")
    plan.add_argument("--gpu-memory", default="80GB", help="memory of one GPU, e.g. 80GB")
    plan.add_argument(
        "--gpu-tflops", type=float, default=989.0,
        help="peak dense TFLOP/s of one GPU in the training dtype (H100 SXM bf16: 989)",
    )  # fmt: skip
    plan.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation (0.4)")
    plan.add_argument(
        "--prompt-tokens", type=int, default=256,
        help="prompt length of a token recipe (its completion is generation.max_new_tokens)",
    )  # fmt: skip
    plan.add_argument(
        "--reserve", type=float, default=0.1,
        help="fraction of each GPU's memory left free (CUDA context, fragmentation, rewards)",
    )  # fmt: skip
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")


def cmd_plan(args: argparse.Namespace) -> int:
    from genrl.config.errors import ConfigError
    from genrl.planning.modelling import parse_memory
    from genrl.planning.plan import plan
    from genrl.planning.report import as_json, text

    if not 0 < args.mfu <= 1:
        raise ConfigError(f"--mfu must be in (0, 1], got {args.mfu}")
    if args.gpu_tflops <= 0:
        raise ConfigError(f"--gpu-tflops must be positive, got {args.gpu_tflops}")
    result = plan(
        args.config, args.gpus, parse_memory(args.gpu_memory), args.gpu_tflops, args.mfu,
        args.prompt_tokens, reserve=args.reserve,
    )  # fmt: skip
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    if args.json:
        out = as_json(result)
        out["peak_rss_mb"] = round(rss)
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        print(text(result))
        print(f"  peak RSS of this process: {rss:.0f} MB")
    return 0
