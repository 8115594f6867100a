"""MARBLE against DiffusionNFT on the weighted sum, two conflicting rewards on the compositional
task, at an equal rollout budget over seeds (issue 36).

Both methods train with their recipes (``genrl/recipes/multi_reward.py``): the same policy,
DiffusionNFT settings, rewards (the GenEval-rule ``compositional`` score and the
``compositional_artifact_probe``, weight 1 each), held-out protocol (25 held-out prompts x 8
fixed-seed 10-step ODE samples) and budget (16 prompts x 8 samples per iteration for
``--iterations``, 200 by default). Each run goes through the ``Trainer`` in this process with
one torch thread; curves are read back from the run's ``metrics.jsonl``.

Reported per method (mean and std over seeds): the held-out finals of both rewards and their sum
(``composite``), and the paper's diagnostic from the training minibatches: the fraction of
minibatches where the worst-aligned reward's gradient has a negative cosine with the update
(``worst_negative_fraction``), the mean worst cosine, and each reward's mean cosine. The
baseline logs the same cosines (``balancing=weighted_sum`` trains exactly as ``diffusion_nft``).
``rollouts_to_baseline_best``: the samples MARBLE draws until its seed-mean held-out composite
first reaches the baseline's best seed-mean point, over the baseline's own (null if never).

Finished runs are cached in ``<output-dir>/results/<method>-seed<k>-it<N>-ev<M>[-quick].json``:
a rerun trains only what is missing, so the benchmark runs in pieces (``--methods``,
``--seeds``) and a last call with everything summarises. The last line is one JSON object.

    python benchmarks/multi_reward.py                          # 2 methods x 3 seeds x 200 it
    python benchmarks/multi_reward.py --seeds 0 --iterations 20 --eval-every 10
    python benchmarks/multi_reward.py --quick                  # smoke run
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cached_runs import train_logged, write_result  # after the paths above

# name -> recipe
METHODS = {
    "weighted_sum": "compositional_marble_weighted_sum",
    "marble": "compositional_marble",
}
REWARDS = ("compositional", "compositional_artifact_probe")
# Held-out score of each balanced reward in the evaluation's metrics.
HELDOUT = {
    "compositional": "compositional/correct",
    "compositional_artifact_probe": "artifact_probe",
}


def _key(method: str, seed: int, iterations: int, eval_every: int, quick: bool) -> str:
    return f"{method}-seed{seed}-it{iterations}-ev{eval_every}" + ("-quick" if quick else "")


def read_run(rows: list[dict[str, Any]], samples_per_iteration: int) -> dict[str, Any]:
    """A run's curve and balance diagnostics from its ``metrics.jsonl`` rows. Curve points:
    ``[iteration, samples drawn, composite, score of each reward]`` at every evaluation (the
    first before training); diagnostics: per iteration, the mean over its minibatches (so
    their mean over iterations weighs every minibatch alike, 9 per iteration)."""
    curve: list[list[float]] = []
    worst_negative: list[float] = []
    worst: list[float] = []
    cosines: dict[str, list[float]] = {r: [] for r in REWARDS}
    weights: dict[str, list[float]] = {r: [] for r in REWARDS}
    for row in rows:
        for r in REWARDS:
            if f"loss/balance/weight/{r}" in row:
                weights[r].append(float(row[f"loss/balance/weight/{r}"]))
        if "loss/balance/worst_negative" in row:
            worst_negative.append(float(row["loss/balance/worst_negative"]))
            worst.append(float(row["loss/balance/worst_cosine"]))
            for r in REWARDS:
                cosines[r].append(float(row[f"loss/balance/cosine/{r}"]))
        if "eval/reward" in row:
            scores = [float(row[f"eval/{HELDOUT[r]}"]) for r in REWARDS]
            iteration = float(row["iteration"])
            point = [iteration, iteration * samples_per_iteration, sum(scores), *scores]
            if curve and curve[-1][0] == point[0]:
                curve[-1] = point
            else:
                curve.append(point)
    return {
        "curve": curve,
        "worst_negative_fraction": statistics.fmean(worst_negative) if worst_negative else None,
        "worst_cosine": statistics.fmean(worst) if worst else None,
        "cosines": {r: statistics.fmean(v) if v else None for r, v in cosines.items()},
        "weights": {r: statistics.fmean(v) if v else None for r, v in weights.items()},
    }


def train_one(
    method: str, seed: int, iterations: int, eval_every: int, quick: bool, out: Path, keep: bool
) -> dict[str, Any]:
    """Train one run (or read its cached result)."""
    key = _key(method, seed, iterations, eval_every, quick)
    cache = out / "results" / f"{key}.json"
    if cache.is_file():
        return {**json.loads(cache.read_text()), "cached": True}
    from genrl import get_recipe
    from genrl.reporting.metrics import read_metrics

    config = get_recipe(METHODS[method])
    overrides = [
        f"seed={seed}",
        f"train.iterations={iterations}",
        f"eval.every={eval_every}",
        "logging.progress_bar=false",
        "logging.tensorboard=false",
        "logging.log_every=100000",
        "logging.checkpoint_every=0",
    ]
    if quick:
        overrides += ["train.prompts_per_iteration=4", "eval.samples_per_prompt=2"]
    config.apply_overrides(overrides)
    summary, run_dir, seconds = train_logged(config, out, key)
    result = {
        "method": method,
        "recipe": config.recipe,
        "seed": seed,
        "seconds": seconds,
        "samples_seen": summary["samples_seen"],
        **read_run(
            read_metrics(run_dir / "metrics.jsonl"),
            config.train.prompts_per_iteration * config.train.group_size,
        ),
    }
    write_result(cache, result)  # a killed run leaves no half-written entry
    if not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {**result, "cached": False}


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def _mean_curve(runs: list[dict[str, Any]]) -> list[list[float]]:
    """Seed-mean curve over the evaluation points all seeds share."""
    length = min(len(r["curve"]) for r in runs)
    return [
        [statistics.fmean(r["curve"][i][j] for r in runs) for j in range(len(runs[0]["curve"][i]))]
        for i in range(length)
    ]


def summarise(by_method: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per-method finals and diagnostics; MARBLE's rollouts to the baseline's best."""
    table: dict[str, Any] = {}
    for method, runs in by_method.items():
        finals = [r["curve"][-1] for r in runs]
        row: dict[str, Any] = {"seeds": [r["seed"] for r in runs]}
        row["before"] = _mean_curve(runs)[0][2:]
        mean, std = _mean_std([f[2] for f in finals])
        row["composite"], row["composite_std"] = mean, std
        for i, reward in enumerate(REWARDS):
            mean, std = _mean_std([f[3 + i] for f in finals])
            row[reward], row[f"{reward}_std"] = mean, std
        for field in ("worst_negative_fraction", "worst_cosine"):
            values = [r[field] for r in runs if r[field] is not None]
            row[field] = statistics.fmean(values) if values else None
        for field in ("cosines", "weights"):
            row[field] = {}
            for reward in REWARDS:
                values = [r[field][reward] for r in runs if r[field][reward] is not None]
                row[field][reward] = statistics.fmean(values) if values else None
        row["seconds"] = statistics.fmean(r["seconds"] for r in runs)
        table[method] = row
    ratio = None
    if "weighted_sum" in by_method and "marble" in by_method:
        base = _mean_curve(by_method["weighted_sum"])
        best = max(base, key=lambda p: p[2])
        base_samples = next(p[1] for p in base if p[2] >= best[2])
        reached = [p[1] for p in _mean_curve(by_method["marble"]) if p[2] >= best[2]]
        if reached and base_samples > 0:
            ratio = reached[0] / base_samples
        elif reached:
            ratio = 0.0  # MARBLE starts at or above the baseline's best (its first point)
    return {"methods": table, "rollouts_to_baseline_best": ratio}


def _names(values: list[str] | None, default: list[str]) -> list[str]:
    return [p for text in values or default for p in text.replace(",", " ").split() if p]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", help="weighted_sum and/or marble (default both)")
    parser.add_argument("--seeds", nargs="+", help="comma/space list (default: 0 1 2)")
    parser.add_argument("--iterations", type=int, default=200, help="budget: x 16 x 8 samples")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--output-dir", type=Path, default=ROOT / "runs" / "bench_multi_reward")
    parser.add_argument("--keep-runs", action="store_true")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 iterations of 4 prompts, seed 0"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds = args.seeds or ["0"]
        args.iterations, args.eval_every = 2, 1
    methods = _names(args.methods, list(METHODS))
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(METHODS)}")
    try:
        seeds = [int(s) for s in _names(args.seeds, ["0", "1", "2"])]
    except ValueError:
        parser.error("--seeds takes integers")
    if min(args.iterations, args.eval_every) < 1:
        parser.error("--iterations and --eval-every must be >= 1")
    import torch

    torch.set_num_threads(1)
    by_method: dict[str, list[dict[str, Any]]] = {}
    trained = cached = 0
    for method in methods:
        for seed in seeds:
            result = train_one(
                method, seed, args.iterations, args.eval_every, args.quick, args.output_dir,
                args.keep_runs,
            )  # fmt: skip
            by_method.setdefault(method, []).append(result)
            cached += result["cached"]
            trained += not result["cached"]
            first, last = result["curve"][0], result["curve"][-1]
            print(
                f"{method:<13} seed {seed}: composite {first[2]:.3f} -> {last[2]:.3f} "
                f"(score {last[3]:.3f}, probe {last[4]:.3f}), worst cosine < 0 in "
                f"{result['worst_negative_fraction']:.0%} of minibatches, "
                f"{result['seconds']:.0f} s{' (cached)' if result['cached'] else ''}",
                flush=True,
            )
    summary = summarise(by_method)
    line = {
        "benchmark": "multi_reward",
        "settings": {
            "methods": methods,
            "seeds": seeds,
            "iterations": args.iterations,
            "eval_every": args.eval_every,
            "samples_per_iteration": (4 if args.quick else 16) * 8,
            "quick": args.quick,
            "threads": 1,
            "recipes": {m: METHODS[m] for m in methods},
            "rewards": list(REWARDS),
        },
        "runs_trained": trained,
        "runs_cached": cached,
        **summary,
    }
    print(json.dumps(line, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
