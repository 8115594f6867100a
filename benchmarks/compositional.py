"""Every flow algorithm on the compositional task (issues 16 and 31): held-out scores against
optimizer steps and against wall-clock, with one sample budget, on two training tracks.

Each method trains with its ``compositional_<method>`` recipe (``genrl/recipes/
compositional.py`` and ``compositional_methods.py``): the same policy, rewards, learning rate,
held-out protocol (25 held-out prompts x 8 fixed-seed 10-step ODE samples) and budget (16
prompts x 8 samples per iteration for ``--iterations``, 200 by default; offline GDRO samples
the same number once, into its store, before training). Each run goes through the ``Trainer``
the CLI uses, in this process, one torch thread, with the held-out evaluation every
``--eval-every`` iterations; the curves are read back from the run's ``metrics.jsonl`` and
``summary.json``.

Tracks (``--tracks``): ``geneval`` trains on the GenEval-rule reward, ``strict`` on ``exact``
(correct with nothing extra on the canvas), a score that filling the canvas cannot win. Both
tracks report both held-out scores: ``final`` (GenEval's rule) and ``final_exact``, each with its
std over seeds and per-category columns (``per_category``, ``per_category_exact``).

Measured per method and track (mean over seeds): the finals above, ``objects`` found, the change
of within-prompt diversity and the artifact probe (both never trained on), ``settings`` (learning
rate and the method's knob, and whether the recipe's or selected by ``--tune``), and how fast it
gets where Flow-GRPO gets on the track's own score: "Flow-GRPO's best" is the best point of
Flow-GRPO's seed-mean curve; a method's steps (seconds) to it are those of the first point of
its own seed-mean curve at or above it (null where never reached), and the ratios divide by
Flow-GRPO's own steps (seconds) to it. ``steps_to_90pct_gain`` does the same for 90% of
Flow-GRPO's gain (before + 0.9 x (best - before)). Curve points average the optimizer steps and
seconds of the seeds at the same iteration. Seconds are training time (rollout, rewards,
update, and offline GDRO's store fill at the start), not evaluation.

``--tune`` first runs each method's equal grid on the validation split of training combinations
and trains the reported seeds at the selected setting (``compositional_tuning.py`` states the
protocol); without it every method runs at its recipe's settings.

Finished runs are cached in ``<output-dir>/results/`` (names: ``compositional_runs.py``): a rerun
trains only what is missing, so the benchmark can be run in pieces (``--methods``, ``--seeds``,
``--tracks``) and summarised by a last call with everything. Run directories are deleted once
cached unless ``--keep-runs``.

    python benchmarks/compositional.py                               # 12 methods x 3 seeds x 2
    python benchmarks/compositional.py --iterations 30 --seeds 0 --methods flow_grpo,ram
    python benchmarks/compositional.py --tracks strict --tune        # tuned, strict track
    python benchmarks/compositional.py --quick                       # smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compositional_runs import (  # after the paths above
    METHODS,
    TRACKS,
    RunSpec,
    Setting,
    settings_of,
    train_one,
)
from compositional_summary import plot, print_table, summarise

QUICK_METHODS = ("flow_grpo", "diffusion_nft")
QUICK_TUNE_METHODS = ("flow_grpo",)  # nine tuning runs: the tune path's smoke in about a minute

__all__ = ["METHODS", "main", "summarise"]


def _names(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", help="comma/space list (default: all)")
    parser.add_argument("--seeds", nargs="+", help="comma/space list (default: 0 1 2)")
    parser.add_argument(
        "--tracks", "--track", nargs="+", help="geneval and/or strict (default: both)"
    )
    parser.add_argument("--iterations", type=int, default=200, help="budget: x 16 x 8 samples")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--tune", action="store_true", help="select settings on validation")
    parser.add_argument("--tune-seeds", nargs="+", help="tuning seeds (default: 100)")
    parser.add_argument("--tune-iterations", type=int, help="default: --iterations")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "runs" / "bench_compositional")
    parser.add_argument("--plot", type=Path, help="PNG path (default <output-dir>/curves.png)")
    parser.add_argument("--keep-runs", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2 iterations of 4 prompts x 8, eval every iteration on 2 samples per "
        "prompt; unless given, methods flow_grpo and diffusion_nft, seed 0 and both tracks "
        "(with --tune: flow_grpo and the geneval track)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.methods = args.methods or list(QUICK_TUNE_METHODS if args.tune else QUICK_METHODS)
        args.seeds = args.seeds or ["0"]
        args.tracks = args.tracks or (["geneval"] if args.tune else None)
        args.iterations, args.eval_every, args.tune_iterations = 2, 1, 2
    args.methods = [m for text in args.methods or list(METHODS) for m in _names(text)]
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(METHODS)}")
    args.tracks = [t for text in args.tracks or list(TRACKS) for t in _names(text)]
    if not set(args.tracks) <= set(TRACKS):
        parser.error(f"--tracks takes {' and/or '.join(TRACKS)}, got {' '.join(args.tracks)}")
    try:
        args.seeds = [int(s) for text in args.seeds or ["0", "1", "2"] for s in _names(text)]
        args.tune_seeds = [int(s) for text in args.tune_seeds or ["100"] for s in _names(text)]
    except ValueError:
        parser.error("--seeds and --tune-seeds take integers")
    if set(args.tune_seeds) & set(args.seeds):
        parser.error("--tune-seeds must differ from --seeds: the reported runs are not tuned on")
    if "flow_grpo" not in args.methods:
        parser.error("--methods: flow_grpo is the baseline; keep it in the list")
    args.tune_iterations = args.tune_iterations or args.iterations
    if min(args.iterations, args.eval_every, args.tune_iterations) < 1:
        parser.error("--iterations, --tune-iterations and --eval-every must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import torch

    torch.set_num_threads(1)
    out: Path = args.output_dir
    by_track: dict[str, dict[str, list[dict[str, Any]]]] = {}
    settings: dict[str, dict[str, dict[str, Any]]] = {}
    tuning: dict[str, dict[str, Any]] = {}
    trained = cached = 0
    for track in args.tracks:
        for method in args.methods:
            chosen: Setting | None = None
            if args.tune:
                from compositional_tuning import tune

                chosen, record, now = tune(
                    method, track, args.tune_seeds, args.tune_iterations, args.eval_every,
                    out, args.quick, args.keep_runs,
                )  # fmt: skip
                tuning.setdefault(track, {})[method] = record
                trained += now
            source = "selected on the validation split" if args.tune else "recipe"
            settings.setdefault(track, {})[method] = settings_of(method, chosen, source)
            for seed in args.seeds:
                started = time.perf_counter()
                spec = RunSpec(
                    method, track, seed, args.iterations, args.eval_every, args.quick, chosen
                )
                result = train_one(spec, out, args.keep_runs)
                by_track.setdefault(track, {}).setdefault(method, []).append(result)
                cached += result["cached"]
                trained += not result["cached"]
                how = "cached" if result["cached"] else f"{time.perf_counter() - started:.0f} s"
                print(
                    f"{track:<8} {method:<15} seed {seed}: held-out {result['curve'][0][3]:.3f}"
                    f" -> {result['final']:.3f}, exact {result['final_exact']:.3f} ({how})",
                    flush=True,
                )
    summaries = {t: summarise(by_track[t], t, settings[t]) for t in args.tracks}
    for track, summary in summaries.items():
        print_table(summary, track)
    picture = args.plot or out / "curves.png"
    plot(by_track, summaries, picture, args.iterations)
    print(f"curves: {picture}")
    line = {
        "benchmark": "compositional",
        "settings": {
            "methods": args.methods,
            "seeds": args.seeds,
            "tracks": args.tracks,
            "iterations": args.iterations,
            "eval_every": args.eval_every,
            "tune": args.tune,
            "tune_seeds": args.tune_seeds if args.tune else [],
            "tune_iterations": args.tune_iterations if args.tune else None,
            "samples_per_iteration": 16 * 8 if not args.quick else 4 * 8,
            "quick": args.quick,
            "threads": 1,
            "recipes": {m: METHODS[m][0] for m in args.methods},
        },
        "runs_trained": trained,
        "runs_cached": cached,
        "tracks": {
            track: {
                "score": summary["score"],
                "flow_grpo_best": summary["flow_grpo_best"],
                "gain90_target": summary["gain90_target"],
                "flow_grpo_gained": summary["flow_grpo_gained"],
                "methods": summary["table"],
                **({"tuning": tuning[track]} if track in tuning else {}),
            }
            for track, summary in summaries.items()
        },
    }
    print(json.dumps(line, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
