"""Every flow algorithm on the compositional task (issue 16): held-out GenEval-rule score against
optimizer steps and against wall-clock, with one sample budget.

Each method trains with its ``compositional_<method>`` recipe (``genrl/recipes/
compositional.py`` and ``compositional_methods.py``): the same policy, rewards, learning rate,
held-out protocol (25 held-out prompts x 8 fixed-seed 10-step ODE samples) and budget (16
prompts x 8 samples per iteration for ``--iterations``, 200 by default; offline GDRO samples
the same number once, into its store, before training). Each run goes through the ``Trainer``
the CLI uses, in this process, one torch thread, with the held-out evaluation every
``--eval-every`` iterations; the curves are read back from the run's ``metrics.jsonl`` and
``summary.json``.

Measured per method (mean over seeds): final held-out score (and its std over seeds), the
per-category finals, ``exact`` (correct with nothing extra), ``objects`` found, the change of
within-prompt diversity and the artifact probe (both never trained on), and how fast it gets
where Flow-GRPO gets: "Flow-GRPO's best" is the best point of Flow-GRPO's seed-mean curve;
a method's steps (seconds) to it are those of the first point of its own seed-mean curve at or
above it (null where never reached), and the ratios divide by Flow-GRPO's own steps (seconds)
to it. ``steps_to_90pct_gain`` does the same for 90% of Flow-GRPO's gain (before + 0.9 x
(best - before)). Curve points average the optimizer steps and seconds of the seeds at the same
iteration (zero-advantage trajectories left out make Flow-GRPO's steps vary a little by seed).
Seconds are training time (rollout, rewards, update, and offline GDRO's store fill at the
start), not evaluation.

Finished runs are cached as ``<output-dir>/results/<method>-seed<k>-it<N>-ev<M>.json``: a rerun
trains only what is missing, so the benchmark can be run in pieces (``--methods``,
``--seeds``) and summarised by a last call with everything. Run directories are deleted once
cached unless ``--keep-runs``.

    python benchmarks/compositional.py                               # ~90 CPU-minutes
    python benchmarks/compositional.py --iterations 30 --seeds 0 --methods flow_grpo,ram
    python benchmarks/compositional.py --quick                       # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name -> (recipe, label, colour)
METHODS: dict[str, tuple[str, str, str]] = {
    "flow_grpo": ("compositional_flow_grpo", "Flow-GRPO", "tab:blue"),
    "flow_grpo_fast": ("compositional_flow_grpo_fast", "Flow-GRPO-Fast", "tab:cyan"),
    "mix_grpo": ("compositional_mix_grpo", "MixGRPO", "tab:orange"),
    "cps": ("compositional_cps", "CPS", "tab:brown"),
    "dance_grpo": ("compositional_dance_grpo", "DanceGRPO", "tab:pink"),
    "branch_grpo": ("compositional_branch_grpo", "BranchGRPO", "tab:gray"),
    "ram": ("compositional_ram", "RAM", "tab:red"),
    "gdro": ("compositional_gdro", "GDRO (online)", "tab:green"),
    "gdro_offline": ("compositional_gdro_offline", "GDRO (offline store)", "tab:olive"),
    "diffusion_nft": ("compositional_diffusion_nft", "DiffusionNFT", "tab:purple"),
}
CATEGORIES = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
QUICK_METHODS = ("flow_grpo", "diffusion_nft")


# -- one run ---------------------------------------------------------------------------------------
def run_key(method: str, seed: int, iterations: int, eval_every: int, quick: bool) -> str:
    """The cache name: a run is reused only with the same method, seed and schedule."""
    return f"{method}-seed{seed}-it{iterations}-ev{eval_every}" + ("-quick" if quick else "")


def train_one(
    method: str, seed: int, iterations: int, eval_every: int, out: Path, quick: bool, keep: bool
) -> dict[str, Any]:
    """Train ``method`` with ``seed`` (or read its cached result); returns its curve and finals.

    The curve is a list of points ``[iteration, optimizer steps, training seconds, held-out
    score]``, the first before training (at the store fill's seconds for offline GDRO)."""
    key = run_key(method, seed, iterations, eval_every, quick)
    cache = out / "results" / f"{key}.json"
    if cache.is_file():
        return {**json.loads(cache.read_text()), "cached": True}
    from genrl import Trainer, get_recipe
    from genrl.reporting.metrics import read_metrics

    run_dir, store = out / "runs" / key, out / "runs" / f"{key}-store"
    config = get_recipe(METHODS[method][0])
    overrides = [
        f"seed={seed}",
        f"train.iterations={iterations}",
        f"eval.every={eval_every}",
        "logging.progress_bar=false",
        "logging.tensorboard=false",
        "logging.log_every=100000",
        "logging.checkpoint_every=0",
    ]
    if quick:  # a smoke run: fewer prompts per iteration and held-out samples per prompt
        overrides += ["train.prompts_per_iteration=4", "eval.samples_per_prompt=2"]
    if config.train.offline_store:
        # The store holds the run's whole sample budget (see compositional_methods.py); an
        # unfinished earlier fill is dropped so that the fill's seconds are all measured.
        shutil.rmtree(store, ignore_errors=True)
        per = 4 if quick else config.train.prompts_per_iteration
        overrides += [f"train.offline_store={store}", f"train.offline_groups={iterations * per}"]
    config.apply_overrides(overrides)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    with (
        open(out / "logs" / f"{key}.log", "w", encoding="utf-8") as log,
        contextlib.redirect_stdout(log),
    ):
        trainer = Trainer(config, run_dir=run_dir, overwrite=True)
        started = time.perf_counter()
        trainer.collector.fill_offline_store()
        fill_s = time.perf_counter() - started if config.train.offline_store else 0.0
        summary = trainer.train()
    result = {
        "method": method,
        "recipe": config.recipe,
        "seed": seed,
        "curve": read_curve(read_metrics(run_dir / "metrics.jsonl"), fill_s),
        "fill_seconds": fill_s,
        "before": summary["heldout_scores_before"],
        "after": summary["heldout_scores_after"],
        "final": summary["heldout_reward_after"],
        "optimizer_steps": summary["optimizer_steps"],
        "samples_seen": summary["samples_seen"],
        "offline_samples": config.train.offline_groups * config.train.group_size,
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(".tmp")
    partial.write_text(json.dumps(result) + "\n")
    os.replace(partial, cache)  # a killed run leaves no half-written cache entry
    if not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    return {**result, "cached": False}


def read_curve(rows: list[dict[str, Any]], start_seconds: float) -> list[list[float]]:
    """Held-out points from ``metrics.jsonl`` rows: the before row (iteration 0, evaluation
    only), the iterations with an evaluation, and the final evaluation (its own row after the
    last iteration's). Seconds add up ``time/iteration_s``, so evaluation time is left out."""
    steps, seconds, points = 0.0, start_seconds, []
    for row in rows:
        if "time/iteration_s" in row:
            seconds += row["time/iteration_s"]
            steps = row["optimizer_steps"]
        if "eval/reward" in row:
            point = [float(row["iteration"]), steps, seconds, float(row["eval/reward"])]
            if points and points[-1][0] == point[0]:
                points[-1] = point
            else:
                points.append(point)
    return points


# -- summaries -------------------------------------------------------------------------------------
def mean_curve(runs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Seed-mean curve: at each iteration every seed evaluated, the mean steps, seconds and
    score, and the score's std over seeds."""
    by_iteration: dict[float, list[list[float]]] = {}
    for run in runs:
        for point in run["curve"]:
            by_iteration.setdefault(point[0], []).append(point)
    curve = []
    for iteration in sorted(by_iteration):
        points = by_iteration[iteration]
        if len(points) < len(runs):
            continue
        scores = [p[3] for p in points]
        curve.append({
            "iteration": iteration,
            "steps": statistics.mean(p[1] for p in points),
            "seconds": statistics.mean(p[2] for p in points),
            "score": statistics.mean(scores),
            "std": statistics.pstdev(scores),
        })  # fmt: skip
    return curve


def first_reaching(curve: list[dict[str, float]], target: float) -> dict[str, float] | None:
    """The first point of ``curve`` at or above ``target`` (a 1e-9 slack for float sums)."""
    return next((p for p in curve if p["score"] >= target - 1e-9), None)


def ratio(value: float | None, baseline: float | None) -> float | None:
    if value is None or not baseline:
        return None
    return round(value / baseline, 3)


def summarise(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per-method figures of the JSON line (see the module docstring)."""
    curves = {m: mean_curve(runs) for m, runs in results.items()}
    flow = curves["flow_grpo"]
    best = max(p["score"] for p in flow)
    before = flow[0]["score"]
    gain90 = before + 0.9 * (best - before)
    flow_best, flow_90 = first_reaching(flow, best), first_reaching(flow, gain90)
    gained = best > before
    if not gained:  # no gain to reach: every "steps to" figure is null
        flow_best = flow_90 = None
    table: dict[str, Any] = {}
    for method, runs in results.items():
        curve = curves[method]
        hit, hit90 = first_reaching(curve, best), first_reaching(curve, gain90)
        if not gained:
            hit = hit90 = None
        finals = [r["final"] for r in runs]

        def change(name: str, runs: list[dict[str, Any]] = runs) -> float | None:
            return _mean([r["after"].get(name, math.nan) - r["before"].get(name, math.nan)
                          for r in runs])  # fmt: skip

        def after(name: str, runs: list[dict[str, Any]] = runs) -> float | None:
            return _mean([r["after"].get(name, math.nan) for r in runs])

        steps = statistics.mean(r["optimizer_steps"] for r in runs)
        fill = statistics.mean(r["fill_seconds"] for r in runs)
        iterations = curve[-1]["iteration"] if curve else 0
        table[method] = {
            "recipe": runs[0]["recipe"],
            "seeds": [r["seed"] for r in runs],
            "before": round(curve[0]["score"], 4),
            "final": round(statistics.mean(finals), 4),
            "final_std": round(statistics.pstdev(finals), 4),
            "best": round(max(p["score"] for p in curve), 4),
            "per_category": {c: after(f"compositional/{c}") for c in CATEGORIES},
            "exact": after("compositional/exact"),
            "objects": after("compositional/objects"),
            "diversity_change": change("sample_diversity"),
            "artifact_probe": after("artifact_probe"),
            "artifact_probe_change": change("artifact_probe"),
            "steps_to_flow_grpo_best": None if hit is None else round(hit["steps"], 1),
            "seconds_to_flow_grpo_best": None if hit is None else round(hit["seconds"], 1),
            "steps_to_flow_grpo_best_ratio": ratio(
                hit and hit["steps"], flow_best and flow_best["steps"]
            ),
            "seconds_to_flow_grpo_best_ratio": ratio(
                hit and hit["seconds"], flow_best and flow_best["seconds"]
            ),
            "steps_to_90pct_gain": ratio(hit90 and hit90["steps"], flow_90 and flow_90["steps"]),
            "seconds_to_90pct_gain": ratio(
                hit90 and hit90["seconds"], flow_90 and flow_90["seconds"]
            ),
            "optimizer_steps": round(steps, 1),
            "steps_per_iteration": round(steps / iterations, 2) if iterations else None,
            "train_seconds": round(curve[-1]["seconds"], 1),
            "fill_seconds": round(fill, 1),
            "seconds_per_iteration": (
                round((curve[-1]["seconds"] - fill) / iterations, 3) if iterations else None
            ),
            "samples_drawn": max(runs[0]["samples_seen"], runs[0]["offline_samples"]),
        }
    return {
        "flow_grpo_best": round(best, 4),
        "gain90_target": round(gain90, 4),
        "flow_grpo_gained": gained,
        "table": table,
    }


def print_table(summary: dict[str, Any]) -> None:
    short = ("single", "two", "count", "colour", "pos", "attr")
    head = (
        f"{'method':<15} {'final':>13} "
        + " ".join(f"{s:>6}" for s in short)
        + f" {'exact':>6} {'objs':>5} {'div d':>7} {'probe':>6} {'st/it':>6} {'s/it':>5}"
        + f" {'st->best':>9} {'ratio':>6} {'s->best':>8} {'st->90%':>8}"
    )
    print(
        f"Flow-GRPO's best seed-mean held-out score {summary['flow_grpo_best']:.3f}; "
        f"90% of its gain {summary['gain90_target']:.3f}"
    )
    print(head)
    for method, row in summary["table"].items():
        cats = " ".join(f"{_show(row['per_category'][c], 2):>6}" for c in CATEGORIES)
        print(
            f"{method:<15} {row['final']:>6.3f}+-{row['final_std']:.3f} {cats} "
            f"{_show(row['exact'], 2):>6} {_show(row['objects'], 2):>5} "
            f"{_show(row['diversity_change'], 3):>7} {_show(row['artifact_probe'], 2):>6} "
            f"{_show(row['steps_per_iteration'], 1):>6} {_show(row['seconds_per_iteration'], 2):>5} "
            f"{_show(row['steps_to_flow_grpo_best'], 0):>9} "
            f"{_show(row['steps_to_flow_grpo_best_ratio'], 2):>6} "
            f"{_show(row['seconds_to_flow_grpo_best'], 0):>8} "
            f"{_show(row['steps_to_90pct_gain'], 2):>8}"
        )


def _mean(values: list[float]) -> float | None:
    """Mean of the finite values (a score is NaN where it does not apply), None if none."""
    finite = [v for v in values if math.isfinite(v)]
    return round(statistics.mean(finite), 4) if finite else None


def _show(value: float | None, digits: int) -> str:
    return "never" if value is None else f"{value:.{digits}f}"


def plot(
    results: dict[str, list[dict[str, Any]]], summary: dict[str, Any], path: Path, iterations: int
) -> None:
    """Two panels: held-out score against optimizer steps and against training seconds; the
    seed mean as a line, +- one std over seeds as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_steps, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for method, runs in results.items():
        _, label, colour = METHODS[method]
        curve = mean_curve(runs)
        score = [p["score"] for p in curve]
        low = [p["score"] - p["std"] for p in curve]
        high = [p["score"] + p["std"] for p in curve]
        for axis, x in ((by_steps, "steps"), (by_time, "seconds")):
            xs = [p[x] for p in curve]
            axis.plot(xs, score, color=colour, label=label if axis is by_steps else None)
            if len(runs) > 1:
                axis.fill_between(xs, low, high, color=colour, alpha=0.15, linewidth=0)
    for axis in (by_steps, by_time):
        axis.axhline(summary["flow_grpo_best"], color="grey", linestyle="--", linewidth=1)
        axis.set_ylabel("held-out GenEval-rule score")
        axis.grid(alpha=0.3)
    by_steps.set_xlabel("optimizer steps")
    by_time.set_xlabel("training seconds (one CPU thread; evaluation excluded)")
    by_steps.legend(loc="lower right", fontsize=7, ncol=2)
    seeds = max(len(r) for r in results.values())
    figure.suptitle(
        f"Compositional task: {iterations} iterations x 16 prompts x 8 samples, mean of "
        f"{seeds} seed(s) (band: +- std); dashed: Flow-GRPO's best"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


# -- command line ----------------------------------------------------------------------------------
def _names(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", help="comma/space list (default: all)")
    parser.add_argument("--seeds", nargs="+", help="comma/space list (default: 0 1 2)")
    parser.add_argument("--iterations", type=int, default=200, help="budget: x 16 x 8 samples")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--output-dir", type=Path, default=ROOT / "runs" / "bench_compositional")
    parser.add_argument("--plot", type=Path, help="PNG path (default <output-dir>/curves.png)")
    parser.add_argument("--keep-runs", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2 iterations of 4 prompts x 8, eval every iteration on 2 samples per "
        "prompt; unless given, methods flow_grpo and diffusion_nft and seed 0",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.methods = args.methods or list(QUICK_METHODS)
        args.seeds = args.seeds or ["0"]
        args.iterations, args.eval_every = 2, 1
    methods = [m for text in args.methods or list(METHODS) for m in _names(text)]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(METHODS)}")
    try:
        seeds = [int(s) for text in args.seeds or ["0", "1", "2"] for s in _names(text)]
    except ValueError:
        parser.error(f"--seeds takes integers, got {' '.join(args.seeds)}")
    if "flow_grpo" not in methods:
        parser.error("--methods: flow_grpo is the baseline; keep it in the list")
    if args.iterations < 1 or args.eval_every < 1:
        parser.error("--iterations and --eval-every must be >= 1")

    import torch

    torch.set_num_threads(1)
    out: Path = args.output_dir
    results: dict[str, list[dict[str, Any]]] = {}
    trained = cached = 0
    for method in methods:
        for seed in seeds:
            started = time.perf_counter()
            result = train_one(
                method, seed, args.iterations, args.eval_every, out, args.quick, args.keep_runs
            )
            results.setdefault(method, []).append(result)
            cached += result["cached"]
            trained += not result["cached"]
            how = "cached" if result["cached"] else f"{time.perf_counter() - started:.0f} s"
            print(
                f"{method:<15} seed {seed}: held-out {result['curve'][0][3]:.3f} -> "
                f"{result['final']:.3f} ({how})",
                flush=True,
            )
    summary = summarise(results)
    print_table(summary)
    picture = args.plot or out / "curves.png"
    plot(results, summary, picture, args.iterations)
    print(f"curves: {picture}")
    line = {
        "benchmark": "compositional",
        "settings": {
            "methods": methods,
            "seeds": seeds,
            "iterations": args.iterations,
            "eval_every": args.eval_every,
            "samples_per_iteration": 16 * 8 if not args.quick else 4 * 8,
            "quick": args.quick,
            "threads": 1,
            "recipes": {m: METHODS[m][0] for m in methods},
        },
        "runs_trained": trained,
        "runs_cached": cached,
        "flow_grpo_best": summary["flow_grpo_best"],
        "gain90_target": summary["gain90_target"],
        "flow_grpo_gained": summary["flow_grpo_gained"],
        "methods": summary["table"],
    }
    print(json.dumps(line, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
