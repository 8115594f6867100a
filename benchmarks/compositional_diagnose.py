"""Why a method stays near its base (issue 31 item 3): its per-iteration training statistics
beside Flow-GRPO's on the same seed and track, read from the runs' ``metrics.jsonl``.

For each method (Flow-GRPO always included) it trains the run (``compositional_runs.train_one``
with the run directory kept) or reuses a kept one under ``<output-dir>/runs/``, then prints, per
quantity, one table of iterations x methods and a last JSON line with every series and each
method's mean over iterations as a ratio to Flow-GRPO's. Quantities a method does not log
(GDRO, RAM, DiffusionNFT, DGPO and AWM have no likelihood ratio) print as ``-`` and are null.

    python benchmarks/compositional_diagnose.py --methods dance_grpo,branch_grpo,gdro --seed 0 \\
        --iterations 20
    python benchmarks/compositional_diagnose.py --quick          # smoke: 2 iterations of 4 x 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compositional_runs import METHODS, TRACKS, RunSpec, train_one  # after the paths above

QUANTITIES: dict[str, str] = {
    "reward/mean": "training reward (the track's)",
    "reward/zero_std_fraction": "groups whose rewards are all equal (no policy gradient)",
    "reward/group_std_mean": "within-group reward std",
    "advantages/abs_mean": "advantage spread (mean |A|)",
    "loss/ratio_mean": "likelihood ratio, mean",
    "loss/ratio_min": "likelihood ratio, min",
    "loss/ratio_max": "likelihood ratio, max",
    "loss/clip_fraction": "clipped fraction",
    "loss/approx_kl": "approximate KL to the rollout policy (0.5 mean log-ratio^2)",
    "loss/kl_loss": "KL to the reference model",
    "loss/log_prob_abs_mean": "per-step log-prob scale (mean |log p|)",
    "loss/transition_std_mean": "noise level (transition std of the trained steps)",
    "grad_norm": "gradient norm",
    "train_units": "training units",
    "optimizer_steps": "optimizer steps so far",
}
"""Metric -> what it shows; the ones the issue asks for, and what explains them."""


def series(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    """``iteration -> value`` of ``key`` over the training rows (evaluation rows left out)."""
    return {
        int(r["iteration"]): float(r[key]) for r in rows if "time/iteration_s" in r and key in r
    }


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per quantity and method: the series and its mean over iterations, and that mean over
    Flow-GRPO's (null where either does not log it, or Flow-GRPO's mean is 0)."""
    out: dict[str, Any] = {}
    for key in QUANTITIES:
        per_method: dict[str, Any] = {}
        for method, rows in runs.items():
            values = series(rows, key)
            mean = statistics.mean(values.values()) if values else None
            per_method[method] = {"series": values, "mean": mean}
        base = per_method["flow_grpo"]["mean"]
        for entry in per_method.values():
            mean = entry["mean"]
            entry["ratio_to_flow_grpo"] = (
                None if mean is None or not base else round(mean / base, 4)
            )
        out[key] = per_method
    return out


def print_tables(comparison: dict[str, Any], every: int) -> None:
    for key, per_method in comparison.items():
        methods = list(per_method)
        iterations = sorted({i for m in methods for i in per_method[m]["series"]})
        if not iterations:
            continue
        print(f"\n{key}: {QUANTITIES[key]}")
        print(f"{'iteration':>9} " + " ".join(f"{m:>14}" for m in methods))
        shown = [i for i in iterations if i % every == 0 or i in (iterations[0], iterations[-1])]
        for i in shown:
            cells = (per_method[m]["series"].get(i) for m in methods)
            print(f"{i:>9} " + " ".join(f"{_cell(v):>14}" for v in cells))
        print(f"{'mean':>9} " + " ".join(f"{_cell(per_method[m]['mean']):>14}" for m in methods))
        ratios = (per_method[m]["ratio_to_flow_grpo"] for m in methods)
        print(f"{'/ flow':>9} " + " ".join(f"{_cell(r):>14}" for r in ratios))


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def read_rows(spec: RunSpec, out: Path) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl`` rows, training it (run directory kept) unless it is kept
    already; a cache entry whose run directory was removed is trained again."""
    from genrl.reporting.metrics import read_metrics

    metrics = out / "runs" / spec.key() / "metrics.jsonl"
    if not metrics.is_file():
        (out / "results" / f"{spec.key()}.json").unlink(missing_ok=True)
        train_one(spec, out, keep=True)
    return read_metrics(metrics)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--methods", default="dance_grpo,branch_grpo,gdro", help="comma list")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--track", default="geneval", choices=TRACKS)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--every", type=int, default=1, help="print every this many iterations")
    parser.add_argument(
        "--output-dir", type=Path, default=ROOT / "runs" / "bench_compositional_diagnose"
    )
    parser.add_argument("--quick", action="store_true", help="2 iterations of 4 prompts x 8")
    args = parser.parse_args(argv)
    methods = ["flow_grpo", *(m for m in args.methods.split(",") if m and m != "flow_grpo")]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(METHODS)}")
    if args.quick:
        args.iterations = 2
    if args.iterations < 1 or args.every < 1:
        parser.error("--iterations and --every must be >= 1")
    import torch

    torch.set_num_threads(1)
    runs = {}
    for method in methods:
        # Evaluation only before and after: the statistics are the training rows'.
        spec = RunSpec(method, args.track, args.seed, args.iterations, args.iterations, args.quick)
        runs[method] = read_rows(spec, args.output_dir)
    comparison = compare(runs)
    print_tables(comparison, args.every)
    line = {
        "benchmark": "compositional_diagnose",
        "settings": {
            "methods": methods,
            "seed": args.seed,
            "track": args.track,
            "iterations": args.iterations,
            "quick": args.quick,
        },
        "quantities": comparison,
    }
    print(json.dumps(line, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
