"""Rollout overhead of the Flow-GRPO SDE sampler (with log-probs) against a plain ODE loop.

Both paths run the same embedded digits model, batch, prompts and sigma schedule in the same
process. The SDE path is exactly what a training rollout calls,
``FlowSDERollout.collect(policy, prompts, group_ids, RolloutNoise(...))`` (Flow-GRPO's rollout): prompt encoding, per-step noise
drawn for the global batch, the SDE step with its Gaussian log-prob, and stacking latents and
log-probs. The ODE baseline is the bare Euler loop ``x = x + (s_next - s) * v`` with prompts
encoded once. The two are interleaved across repeats (alternating which goes first) and compared
by their median wall time.

Usage::

    python benchmarks/rollout_overhead.py            # batch 128 (default job) and 512, 10 steps
    python benchmarks/rollout_overhead.py --quick    # smoke run, a few repeats
    python benchmarks/rollout_overhead.py --batch-size 256 --steps 20

The last line of output is one JSON object (benchmarks/README.md); its headline
``sde_over_ode_time_ratio`` is for the first ``--batch-size`` (target: <= 1.15).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable

import torch
from timing import time_interleaved  # benchmarks/timing.py

import genrl
from genrl.algorithms.flow_grpo import FlowGRPO
from genrl.data.rng import RolloutNoise
from genrl.loop.groups import expand_groups
from genrl.rollouts.flow_sde import FlowSDERollout
from pipelines.toy.policy import ToyDigitsPolicy
from tasks.digits import TEMPLATES, prompt_for

RECIPE = "digits_flow_grpo"
TARGET_RATIO = 1.15


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--batch-size",
        type=int,
        nargs="+",
        default=[128, 512],
        help="rollout batch sizes; the first is the headline (default: 128 512)",
    )
    parser.add_argument("--steps", type=int, default=10, help="sampling steps (default: 10)")
    parser.add_argument(
        "--repeats", type=int, default=30, help="timed repeats of each method (default: 30)"
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed repeats of each method (default: 3)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="noise seed (default: 0)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 5 repeats, 1 warm-up (unless given)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        if "--repeats" not in (argv if argv is not None else sys.argv[1:]):
            args.repeats = 5
        if "--warmup" not in (argv if argv is not None else sys.argv[1:]):
            args.warmup = 1
    if min(args.batch_size) < 1 or args.steps < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("batch sizes, --steps and --repeats must be >= 1, --warmup >= 0")
    return args


def make_prompts(batch_size: int, group_size: int) -> tuple[list[str], torch.Tensor]:
    """A training-like batch: distinct prompts, each repeated ``group_size`` times."""
    group_size = min(group_size, batch_size)
    num_prompts = math.ceil(batch_size / group_size)
    unique = [prompt_for(i % 10, (i // 10) % len(TEMPLATES)) for i in range(num_prompts)]
    prompts, group_ids = expand_groups(unique, group_size)
    return prompts[:batch_size], group_ids[:batch_size]


def sde_rollout(
    rollout: FlowSDERollout,
    policy: ToyDigitsPolicy,
    prompts: list[str],
    group_ids: torch.Tensor,
    seed: int,
) -> Callable[[int], torch.Tensor]:
    """One training rollout per call (``iteration`` varies the noise, as in training)."""
    batch = len(prompts)

    def run(iteration: int) -> torch.Tensor:
        noise = RolloutNoise(seed, iteration, num_global=batch, local=slice(0, batch))
        trajectory = rollout.collect(policy, prompts, group_ids, noise)
        return trajectory.final

    return run


def ode_rollout(
    policy: ToyDigitsPolicy,
    prompts: list[str],
    sigmas: torch.Tensor,
    guidance_scale: float,
    seed: int,
) -> Callable[[int], torch.Tensor]:
    """The plain Euler loop on the same model, prompts (encoded once) and sigmas."""
    batch = len(prompts)
    condition = policy.encode_prompts(prompts)
    levels = [sigmas[i].expand(batch) for i in range(sigmas.numel() - 1)]
    dts = [float(sigmas[i + 1] - sigmas[i]) for i in range(sigmas.numel() - 1)]
    shape = (batch, *policy.latent_shape)

    @torch.no_grad()
    def run(iteration: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
        x = torch.randn(shape, generator=generator)
        for sigma, dt in zip(levels, dts, strict=True):
            v = policy.velocity(x, sigma, condition, guidance_scale)
            x = x + dt * v
        return x

    return run


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def measure(
    batch_size: int,
    args: argparse.Namespace,
    policy: ToyDigitsPolicy,
    config: genrl.TrainConfig,
) -> dict[str, float | int]:
    rollout, _ = FlowGRPO(config.algorithm, config).build(policy)  # on the policy's schedule
    prompts, group_ids = make_prompts(batch_size, config.train.group_size)
    methods = {
        "ode": ode_rollout(
            policy, prompts, rollout.sampler.sigmas, rollout.guidance_scale, args.seed
        ),
        "sde": sde_rollout(rollout, policy, prompts, group_ids, args.seed),
    }
    times = time_interleaved(methods, args.repeats, args.warmup)
    result: dict[str, float | int] = {"batch_size": batch_size}
    for name, values in times.items():
        median = statistics.median(values)
        q1, q3 = quartiles(values)
        result[f"{name}_median_ms"] = round(median * 1e3, 3)
        result[f"{name}_iqr_ms"] = round((q3 - q1) * 1e3, 3)
        result[f"{name}_samples_per_s"] = round(batch_size / median, 1)
    result["sde_over_ode_time_ratio"] = round(
        statistics.median(times["sde"]) / statistics.median(times["ode"]), 4
    )
    # Back-to-back pairs share the machine's momentary load, so their ratio is less noisy.
    paired = [s / o for s, o in zip(times["sde"], times["ode"], strict=True)]
    result["paired_ratio_median"] = round(statistics.median(paired), 4)
    return result


def print_table(rows: list[dict[str, float | int]], steps: int, repeats: int) -> None:
    print(f"Rollout time, median of {repeats} interleaved repeats ({steps} steps):")
    header = (
        f"{'batch':>6}  {'ODE ms':>9}  {'SDE ms':>9}  {'ODE samples/s':>13}  "
        f"{'SDE samples/s':>13}  {'SDE/ODE':>7}  {'paired':>7}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['batch_size']:>6}  {row['ode_median_ms']:>9.2f}  {row['sde_median_ms']:>9.2f}  "
            f"{row['ode_samples_per_s']:>13.0f}  {row['sde_samples_per_s']:>13.0f}  "
            f"{row['sde_over_ode_time_ratio']:>7.3f}  {row['paired_ratio_median']:>7.3f}"
        )
    print(
        f"SDE/ODE = ratio of the median times (target <= {TARGET_RATIO} at batch "
        f"{rows[0]['batch_size']}); paired = median of the back-to-back per-repeat ratios."
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    wall_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    config = genrl.get_recipe(RECIPE)
    config.sampler.num_steps = args.steps
    policy = ToyDigitsPolicy()
    policy.module.eval()
    num_params = sum(p.numel() for p in policy.network.parameters())

    rows = [measure(batch_size, args, policy, config) for batch_size in args.batch_size]
    print_table(rows, args.steps, args.repeats)

    head = rows[0]
    summary = {
        "benchmark": "rollout_overhead",
        "sde_over_ode_time_ratio": head["sde_over_ode_time_ratio"],
        "paired_ratio_median": head["paired_ratio_median"],
        "target_ratio": TARGET_RATIO,
        "meets_target": head["sde_over_ode_time_ratio"] <= TARGET_RATIO,
        "sde_samples_per_s": head["sde_samples_per_s"],
        "ode_samples_per_s": head["ode_samples_per_s"],
        "sde_median_ms": head["sde_median_ms"],
        "ode_median_ms": head["ode_median_ms"],
        "batch_size": head["batch_size"],
        "steps": args.steps,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "quick": args.quick,
        "model": config.policy.name,
        "model_parameters": num_params,
        "recipe": RECIPE,
        "noise_level": config.sampler.noise_level,
        "guidance_scale": config.sampler.guidance_scale,
        "torch_version": torch.__version__,
        "num_threads": torch.get_num_threads(),
        "per_batch_size": {str(row["batch_size"]): row for row in rows},
        "wall_seconds": round(time.perf_counter() - wall_start, 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
