"""Replay methods on the embedded Countdown LM (issue 36): GRPO, ExGRPO and GRPO with AR3PO's
response reuse, held-out accuracy against the completions each method generated.

Each method trains with its recipe (``llm_countdown_grpo``, ``llm_countdown_exgrpo``,
``llm_countdown_grpo_reuse``: ``genrl/recipes/text.py`` and ``replay.py``): the same model,
prompts, groups of 8, learning-rate schedule and held-out protocol (200 held-out problems,
greedy), for the same number of iterations (``--iterations``, the recipes' 200 by default). That
is an equal budget of iterations and an at-most-equal budget of generated completions: GRPO and
GRPO+reuse generate ``32 x 8`` per iteration, ExGRPO fewer (a replayed group samples 7, its
eighth is the stored completion; ``replay/generated`` counts them). Each run goes through the
``Trainer`` the CLI uses, in this process, with ``OMP_NUM_THREADS`` as set by the caller.

Measured per method (mean over seeds): ``final`` held-out accuracy and its std, ``generated``
completions, and rollouts to GRPO's target, where the target is GRPO's seed-mean gain at 90%
(``before + 0.9 (best - before)``, best over GRPO's seed-mean curve): a method's rollouts to it
are the generated completions at the first point of its own seed-mean curve at or above it (null
where never reached); ``rollouts_to_target_ratio`` divides GRPO's by the method's (above 1: the
method needs fewer rollouts).

Finished runs are cached as JSON in ``--output-dir`` (``benchmarks/results/replay`` by default),
one file per method, seed and iteration count, so the benchmark runs in pieces (``--methods``,
``--seeds``) and a last call with everything summarises. The last line printed is the JSON
summary.

    python benchmarks/replay.py                                   # 3 methods x 3 seeds, 200 its
    python benchmarks/replay.py --methods exgrpo --seeds 1        # one piece
    python benchmarks/replay.py --iterations 6 --eval-every 3 --seeds 0    # smoke run
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = {
    "grpo": "llm_countdown_grpo",
    "exgrpo": "llm_countdown_exgrpo",
    "grpo_reuse": "llm_countdown_grpo_reuse",
}
ACCURACY = "eval/countdown/accuracy"


def _names(values: list[str] | None, default: list[str]) -> list[str]:
    if not values:
        return default
    return [part for value in values for part in value.replace(",", " ").split() if part]


def train_one(method: str, seed: int, iterations: int, eval_every: int) -> dict[str, Any]:
    """One run; its held-out curve against generated completions, and its timings."""
    from genrl import get_recipe
    from genrl.loop.trainer import Trainer
    from genrl.reporting.metrics import read_metrics

    config = get_recipe(METHODS[method]).apply_overrides([
        f"seed={seed}",
        f"train.iterations={iterations}",
        f"eval.every={eval_every}",
        "logging.progress_bar=false",
        "logging.report_to=[]",
        "logging.checkpoint_every=0",
    ])  # fmt: skip
    per_iteration = config.train.prompts_per_iteration * config.train.group_size
    directory = Path(tempfile.mkdtemp(prefix=f"replay-{method}-"))
    start = time.perf_counter()
    try:
        Trainer(config, run_dir=directory / "run").train()
        rows = read_metrics(directory / "run" / "metrics.jsonl")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    generated: dict[int, float] = {0: 0.0}
    replayed = reused = 0.0
    for row in rows:
        if "train_units" in row:
            step = int(row["iteration"])
            generated[step] = row.get("replay/generated", per_iteration)
            replayed += row.get("replay/replayed", 0.0)
            reused += row.get("replay/reused", 0.0)
    cumulative, total = {}, 0.0
    for step in sorted(generated):
        total += generated[step]
        cumulative[step] = total
    curve = [
        {"iteration": int(r["iteration"]), "rollouts": cumulative[int(r["iteration"])],
         "accuracy": float(r[ACCURACY])}
        for r in rows if ACCURACY in r
    ]  # fmt: skip
    return {
        "method": method,
        "seed": seed,
        "iterations": iterations,
        "curve": curve,
        "generated": total,
        "replayed": replayed,
        "reused": reused,
        "seconds": time.perf_counter() - start,
    }


def _mean_curve(runs: list[dict[str, Any]]) -> list[dict[str, float]]:
    points = zip(*(run["curve"] for run in runs), strict=True)
    return [
        {
            "iteration": p[0]["iteration"],
            "rollouts": sum(q["rollouts"] for q in p) / len(p),
            "accuracy": sum(q["accuracy"] for q in p) / len(p),
        }
        for p in points
    ]


def _rollouts_to(curve: list[dict[str, float]], target: float) -> float | None:
    for point in curve:
        if point["accuracy"] >= target:
            return point["rollouts"]
    return None


def summarise(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Finals, generated completions and rollouts to GRPO's 90%-gain target per method."""
    curves = {m: _mean_curve(runs) for m, runs in results.items()}
    summary: dict[str, Any] = {"methods": {}}
    target = None
    if "grpo" in curves:
        base = curves["grpo"]
        before, best = base[0]["accuracy"], max(p["accuracy"] for p in base)
        target = before + 0.9 * (best - before)
        summary["target"] = target
    grpo_rollouts = _rollouts_to(curves["grpo"], target) if target is not None else None
    for method, runs in results.items():
        finals = [run["curve"][-1]["accuracy"] for run in runs]
        mean = sum(finals) / len(finals)
        std = (sum((f - mean) ** 2 for f in finals) / len(finals)) ** 0.5
        reached = _rollouts_to(curves[method], target) if target is not None else None
        ratio = grpo_rollouts / reached if grpo_rollouts and reached else None
        summary["methods"][method] = {
            "seeds": [run["seed"] for run in runs],
            "before": curves[method][0]["accuracy"],
            "final": mean,
            "final_std": std,
            "finals": finals,
            "generated": sum(run["generated"] for run in runs) / len(runs),
            "replayed": sum(run["replayed"] for run in runs) / len(runs),
            "reused": sum(run["reused"] for run in runs) / len(runs),
            "rollouts_to_target": reached,
            "rollouts_to_target_ratio": ratio,
            "seconds": sum(run["seconds"] for run in runs) / len(runs),
        }
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", help=f"comma/space list of {', '.join(METHODS)}")
    parser.add_argument("--seeds", nargs="+", help="comma/space list (default: 0 1 2)")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--output-dir", type=Path, default=ROOT / "benchmarks/results/replay")
    args = parser.parse_args(argv)
    methods = _names(args.methods, list(METHODS))
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    seeds = [int(s) for s in _names(args.seeds, ["0", "1", "2"])]
    args.output_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {}
    for method in methods:
        for seed in seeds:
            path = args.output_dir / f"{method}-s{seed}-it{args.iterations}-e{args.eval_every}.json"
            if path.is_file():
                run = json.loads(path.read_text())
            else:
                run = train_one(method, seed, args.iterations, args.eval_every)
                path.write_text(json.dumps(run, indent=1) + "\n")
            results.setdefault(method, []).append(run)
            print(
                f"{method} seed {seed}: held-out accuracy {run['curve'][0]['accuracy']:.3f} -> "
                f"{run['curve'][-1]['accuracy']:.3f}, {run['generated']:.0f} generated, "
                f"{run['seconds']:.0f} s",
                flush=True,
            )
    summary = summarise(results)
    summary.update({"iterations": args.iterations, "eval_every": args.eval_every})
    print(json.dumps(summary, sort_keys=True))
    return summary


if __name__ == "__main__":
    main()
