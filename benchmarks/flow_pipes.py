"""Helpers shared by the benchmarks that set a flow policy's training rollout against its stock
diffusers pipeline (``diffusers_overhead.py`` for SD3 images, ``video_overhead.py`` for Wan
videos): quiet library set-up, the tiny-pipeline builders on the path, the policy as the trainer
builds it, the prompts, our rollout as a timed callable and the per-phase profile of both paths.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from timing import PhaseTimer, autocast, synchronize

from genrl.data.rng import RolloutNoise
from genrl.loop.groups import expand_groups
from genrl.rollouts.flow_sde import FlowSDERollout

TESTS = Path(__file__).resolve().parents[1] / "tests"  # tests/diffusers_tiny.py
PROMPT_WORDS = (
    ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"],
    ["cat", "dog", "tree", "car", "house", "boat", "bird", "flower"],
)
Run = Callable[[int], torch.Tensor]


def quiet_libraries() -> None:
    """Quiet transformers' and diffusers' notices and progress bars (the environment variables
    must be set before their first import) and put ``tests/`` on the path for the tiny
    pipeline builders."""
    for name in ("TRANSFORMERS_VERBOSITY", "DIFFUSERS_VERBOSITY"):
        os.environ.setdefault(name, "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import diffusers
    import transformers

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))


def build_trained_policy(
    name: str,
    directory: Path,
    args: argparse.Namespace,
    device: torch.device,
    *,
    checkpointing: bool = False,
    **policy_kwargs: Any,
) -> Any:
    """The adapter as the trainer builds it: loaded from disk, LoRA set up from the run's seed
    (``args.lora_rank``, ``args.lora_alpha``), every component on ``device``."""
    from pipelines import build_policy

    policy = build_policy(
        name,
        pretrained=str(directory),
        height=args.height,
        width=args.width,
        dtype=args.dtype,
        gradient_checkpointing=checkpointing,
        **policy_kwargs,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        policy.setup_training(args.lora_rank, args.lora_alpha, None)
    policy.pipe.to(device)
    policy.pipe.set_progress_bar_config(disable=True)
    return policy


def make_prompts(batch: int, group_size: int) -> tuple[list[str], list[str], torch.Tensor]:
    """Distinct prompts, and the training batch (each repeated ``group_size`` times)."""
    colours, things = PROMPT_WORDS
    unique = [
        f"a {colours[i % len(colours)]} {things[(i // len(colours)) % len(things)]}"
        for i in range(batch // group_size)
    ]
    prompts, group_ids = expand_groups(unique, group_size)
    return unique, prompts, group_ids


def ours_rollout(
    rollout: FlowSDERollout,
    policy: Any,
    prompts: list[str],
    group_ids: torch.Tensor,
    args: argparse.Namespace,
    device: torch.device,
    instrument: Callable[[RolloutNoise], None] | None = None,
) -> Run:
    """One training rollout (Flow-GRPO's ``FlowSDERollout.collect`` as ``Trainer.collect``
    calls it) per call."""
    batch = len(prompts)

    def run(iteration: int) -> torch.Tensor:
        noise = RolloutNoise(args.seed, iteration, num_global=batch, local=slice(0, batch))
        if instrument is not None:
            instrument(noise)
        policy.module.eval()
        with torch.no_grad(), autocast(device, args.dtype):
            trajectory = rollout.collect(policy, prompts, group_ids, noise)
        synchronize(device)
        return trajectory.final

    return run


def profile_phases(
    rollout: FlowSDERollout,
    policy: Any,
    ours: Callable[[Callable[[RolloutNoise], None]], Run],
    pipe_run: Run,
    repeats: int,
    device: torch.device,
) -> dict[str, dict[str, float]]:
    """Milliseconds per rollout in each phase (exclusive of nested phases) for both paths.
    ``ours(instrument)`` makes our rollout with ``instrument`` applied to each call's noise;
    ``pipe_run`` is the stock pipeline call on ``policy.pipe``."""
    transformer = policy.pipe.transformer
    out: dict[str, dict[str, float]] = {}

    # Ours: encode -> velocity (CFG cat/combine) -> forward_model (ModelMixin.dtype lookup, casts,
    # timesteps, the peft wrapper) -> transformer.forward; SDE/ODE step math; per-step noise draws
    # (CPU draw + copy to the device); the rest is the loop itself and stacking the trajectory.
    timer = PhaseTimer(device)
    with timer.installed():
        timer.wrap(policy, "encode_prompts", "encode")
        timer.wrap(policy, "velocity", "velocity")
        timer.wrap(policy, "forward_model", "forward_model")
        timer.wrap(transformer, "forward", "transformer")
        timer.wrap_property(type(transformer), "dtype", "dtype_lookup")
        timer.wrap(rollout.sde, "step", "sampler_step")
        timer.wrap(rollout.ode, "step", "sampler_step")

        def instrument(noise: RolloutNoise) -> None:
            timer.wrap(noise, "randn", "noise_draws")

        total = timed_total(ours(instrument), repeats)
    s = {k: v / repeats * 1e3 for k, v in timer.seconds.items()}
    out["ours"] = {
        "total": total * 1e3,
        "prompt_encoding": s.get("encode", 0.0),
        "transformer_forward": s.get("transformer", 0.0),
        "transformer_dtype_lookup": s.get("dtype_lookup", 0.0),
        "adapter_forward_model_other": s.get("forward_model", 0.0)
        - s.get("transformer", 0.0)
        - s.get("dtype_lookup", 0.0),
        "cfg_velocity_excl_forward_model": s.get("velocity", 0.0) - s.get("forward_model", 0.0),
        "sampler_step": s.get("sampler_step", 0.0),
        "noise_draws": s.get("noise_draws", 0.0),
    }
    out["ours"]["loop_and_stacking"] = out["ours"]["total"] - sum(
        v for k, v in out["ours"].items() if k != "total"
    )

    # The pipe: encode_prompt (prompts and negatives, every call) -> transformer.forward;
    # scheduler.step; the rest is the pipe's own loop, latents preparation and set_timesteps.
    pipe = policy.pipe
    timer = PhaseTimer(device)
    with timer.installed():
        timer.wrap(pipe, "encode_prompt", "encode")
        timer.wrap(transformer, "forward", "transformer")
        timer.wrap_property(type(transformer), "dtype", "dtype_lookup")
        timer.wrap(pipe.scheduler, "step", "sampler_step")
        total = timed_total(pipe_run, repeats)
    s = {k: v / repeats * 1e3 for k, v in timer.seconds.items()}
    out["pipe"] = {
        "total": total * 1e3,
        "prompt_encoding": s.get("encode", 0.0),
        "transformer_forward": s.get("transformer", 0.0),
        "transformer_dtype_lookup": s.get("dtype_lookup", 0.0),
        "sampler_step": s.get("sampler_step", 0.0),
    }
    out["pipe"]["loop_and_other"] = out["pipe"]["total"] - sum(
        v for k, v in out["pipe"].items() if k != "total"
    )
    return {side: {k: round(v, 3) for k, v in phases.items()} for side, phases in out.items()}


def timed_total(run: Run, repeats: int) -> float:
    """Mean seconds per call over ``repeats`` calls (iterations 10000 on)."""
    start = time.perf_counter()
    for r in range(repeats):
        run(10_000 + r)
    return (time.perf_counter() - start) / repeats


def print_rollout_table(
    times: dict[str, list[float]],
    median: dict[str, float],
    batch: int,
    unit: str,
    ratio: float,
    paired: float,
    target: float,
    profile: dict[str, dict[str, float]] | None,
) -> None:
    """Part (a) of both overhead reports: each method's median and IQR, throughput in
    ``unit`` per second, the ratio against the target, and the per-phase profile if any."""
    import statistics

    header = f"{'method':<34}  {'median ms':>10}  {'IQR ms':>8}  {unit + '/s':>9}"
    print(header)
    print("-" * len(header))
    labels = {
        "pipe": "pipe(..., output_type='latent')",
        "ours": "FlowSDERollout.collect (log-probs)",
    }
    for name in ("pipe", "ours"):
        values = times[name]
        q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        print(
            f"{labels[name]:<34}  {median[name] * 1e3:>10.2f}  {(q[2] - q[0]) * 1e3:>8.2f}  "
            f"{batch / median[name]:>9.2f}"
        )
    verdict = "met" if ratio <= target else "NOT met"
    print(
        f"ours/pipe time ratio {ratio:.3f} (paired median {paired:.3f}); target <= "
        f"{target}: {verdict}"
    )
    if profile is not None:
        print("Per-phase ms per rollout (exclusive; the timers add a little to the totals):")
        for side, phases in profile.items():
            parts = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
            print(f"  {side}: {parts}")
