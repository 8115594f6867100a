"""Allocation methods on Countdown (issue 36): held-out accuracy against the rollouts spent.

Every method trains the embedded Countdown LM with GRPO's objective (the ``llm_countdown_grpo``
recipe: its learning rate, KL, clip range, passes and schedule) and spends the same rollout
budget (``--budget`` samples, counting every sample drawn: pilots, profiles, refills):

- ``grpo``: uniform groups, 32 prompts x 8 samples per iteration (the recipe);
- ``pilot_commit``: the released 1.5B script's proportions (pilots on 3x the training prompts,
  a pilot a third of a commit, so pilots and commits cost the same, p32c96 there): 8 committed
  prompts per iteration, pilots of 4 on 24 prompts, 12 fresh samples per committed prompt
  (groups of 16), its thresholds (0.125 / 0.75), eviction at 1.0, four iterations of
  pilot age; 192 samples per iteration after the first;
- ``sorted_groups`` (sGPO): a profile of 8 samples on each of the 1,000 training prompts, then
  groups of ``ceil(1/p)`` (2 .. 32) from easy to hard filling GRPO's 256 samples per iteration.

Each method's iterations are its budget divided by its samples per iteration (the cosine
schedule spans them), so all end near ``--budget``. The held-out evaluation (200 problems,
greedy) runs at about every 5% of the budget. Reported: per method the seed-mean accuracy
before and after, the gain, the samples at which its seed-mean curve first reaches a target,
and the ratio of GRPO's samples to it (the papers' "x fewer rollouts"): targets are GRPO's
final seed-mean accuracy and 90% of GRPO's gain. Each run (method, seed) is cached in
``<output-dir>/results/`` so the benchmark runs in pieces; the last line is one JSON object.

    python benchmarks/allocation.py                                  # 3 methods x 3 seeds
    python benchmarks/allocation.py --methods grpo --seeds 0 --budget 12800
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GRPO_PER_ITERATION = 32 * 8
PC_FIRST, PC_PER_ITERATION = 96 + 192, 192
PROFILE = 1000 * 8

METRIC = "countdown/accuracy"
METHODS: dict[str, list[str]] = {
    "grpo": [],
    "pilot_commit": [
        "allocation.name=pilot_commit",
        f"allocation.metric={METRIC}",
        "train.prompts_per_iteration=8",
        "train.group_size=12",
        "allocation.pilot_commit.pilot_samples=4",
        "allocation.pilot_commit.pilot_prompts_factor=3",
    ],
    "sorted_groups": [
        "allocation.name=sorted_groups",
        f"allocation.metric={METRIC}",
        "allocation.sorted_groups.profile_samples=8",
    ],
}


def iterations_for(method: str, budget: int) -> int:
    """The iterations that spend ``budget`` samples (at least one)."""
    if method == "pilot_commit":
        return max(1, 1 + (budget - PC_FIRST) // PC_PER_ITERATION)
    if method == "sorted_groups":
        return max(1, (budget - PROFILE) // GRPO_PER_ITERATION)
    return max(1, budget // GRPO_PER_ITERATION)


def run_one(method: str, seed: int, budget: int, out: Path) -> dict[str, Any]:
    """Train one (method, seed), or read it from the cache."""
    key = f"{method}-seed{seed}-budget{budget}"
    cache = out / "results" / f"{key}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    from genrl import Trainer, get_recipe
    from genrl.reporting.metrics import read_metrics

    iterations = iterations_for(method, budget)
    config = get_recipe("llm_countdown_grpo").apply_overrides(
        [
            *METHODS[method],
            f"seed={seed}",
            f"train.iterations={iterations}",
            f"eval.every={max(1, iterations // 20)}",
            "logging.progress_bar=false",
            "logging.report_to=[]",
            "logging.log_every=100000",
        ]
    )
    run_dir = out / "runs" / key
    (out / "logs").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with (
        open(out / "logs" / f"{key}.log", "w", encoding="utf-8") as log,
        contextlib.redirect_stdout(log),
    ):
        summary = Trainer(config, run_dir=run_dir, overwrite=True).train()
    per_iteration = config.train.prompts_per_iteration * config.train.group_size
    samples, curve = 0.0, []
    for row in read_metrics(run_dir / "metrics.jsonl"):
        if "train_units" in row:
            samples += row.get("allocation/samples_generated", per_iteration)
        if f"eval/{METRIC}" in row:
            point = [float(row["iteration"]), samples, float(row[f"eval/{METRIC}"])]
            curve = [p for p in curve if p[0] != point[0]] + [point]
    result = {
        "method": method,
        "seed": seed,
        "budget": budget,
        "iterations": iterations,
        "samples": samples,
        "curve": curve,
        "before": curve[0][2],
        "after": curve[-1][2],
        "seconds": time.perf_counter() - started,
        "summary_accuracy": summary.get("heldout_scores_after", {}).get(METRIC),
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(".tmp")
    partial.write_text(json.dumps(result) + "\n")
    os.replace(partial, cache)
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def mean_curve(runs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """``(samples, accuracy)`` averaged over seeds at each evaluated iteration all share."""
    shared = set.intersection(*({p[0] for p in r["curve"]} for r in runs))
    points = []
    for iteration in sorted(shared):
        rows = [next(p for p in r["curve"] if p[0] == iteration) for r in runs]
        points.append((sum(p[1] for p in rows) / len(rows), sum(p[2] for p in rows) / len(rows)))
    return points


def samples_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """Samples at the first point at or above ``target`` (None: never)."""
    return next((s for s, a in curve if a >= target - 1e-12), None)


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    by_method: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_method.setdefault(r["method"], []).append(r)
    curves = {m: mean_curve(rs) for m, rs in by_method.items()}
    table: dict[str, Any] = {}
    targets: dict[str, float] = {}
    if "grpo" in curves:
        grpo = curves["grpo"]
        targets = {
            "grpo_final": grpo[-1][1],
            "grpo_90pct_gain": grpo[0][1] + 0.9 * (grpo[-1][1] - grpo[0][1]),
        }
    for method, runs in by_method.items():
        curve = curves[method]
        row: dict[str, Any] = {
            "seeds": sorted(r["seed"] for r in runs),
            "before": curve[0][1],
            "after": curve[-1][1],
            "gain": curve[-1][1] - curve[0][1],
            "after_per_seed": [r["after"] for r in sorted(runs, key=lambda r: r["seed"])],
            "samples": sum(r["samples"] for r in runs) / len(runs),
            "seconds": sum(r["seconds"] for r in runs) / len(runs),
        }
        for name, target in targets.items():
            mine, theirs = samples_to(curve, target), samples_to(curves["grpo"], target)
            row[f"samples_to_{name}"] = mine
            row[f"ratio_to_{name}"] = None if mine is None or theirs is None else theirs / mine
        table[method] = row
    return {"targets": targets, "methods": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=51_200, help="samples per run")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "runs" / "bench_allocation")
    args = parser.parse_args()
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {sorted(METHODS)}")
    import torch

    torch.set_num_threads(1)
    results = []
    for method in args.methods:
        for seed in args.seeds:
            result = run_one(method, seed, args.budget, args.output_dir)
            results.append(result)
            print(
                f"{method:14s} seed {seed}: {result['before']:.3f} -> {result['after']:.3f} "
                f"({result['samples']:.0f} samples, {result['seconds']:.0f} s)",
                flush=True,
            )
    summary = summarise(results)
    for method, row in summary["methods"].items():
        ratio = row.get("ratio_to_grpo_90pct_gain")
        shown = "never" if ratio is None else f"{ratio:.2f}x"
        print(
            f"{method:14s} {row['before']:.3f} -> {row['after']:.3f} (gain {row['gain']:+.3f}); "
            f"rollouts to 90% of GRPO's gain vs GRPO: {shown}"
        )
    print(json.dumps({"budget": args.budget, **summary}))


if __name__ == "__main__":
    main()
