"""MaskGRPO vs diffu-GRPO (d1) on an embedded masked-token task: held-out score against
iterations and wall-clock time, over several seeds.

Tasks (``--task``): ``sudoku``, the embedded Sudoku dLLM (recipes ``dllm_sudoku_maskgrpo``,
``dllm_sudoku_d1``; held-out metric: solved rate of sampled completions at the training
temperature, 4 per puzzle on 200 puzzles, and the greedy solved rate before and after);
``compositional_discrete``, the embedded 32x32 aMUSEd pipeline of the compositional scenes
(``compositional_discrete_maskgrpo``, ``compositional_discrete_d1``; held-out ``compositional``,
GenEval's rule, with ``exact`` (nothing extra on the canvas) and the objects per canvas beside
it, so that filling the canvas shows). Both algorithms run their recipes unchanged except for
the seed, the iteration count and the evaluation interval; each run's held-out metric is read
at every evaluation with the training wall-clock at that point.

Usage::

    python benchmarks/dllm_estimators.py                       # Sudoku, 3 seeds
    python benchmarks/dllm_estimators.py --jobs 2              # two runs at a time (2 cores)
    python benchmarks/dllm_estimators.py --task compositional_discrete --jobs 2
    python benchmarks/dllm_estimators.py --seeds 0 --iterations 4 --eval-every 2   # smoke run

With ``--jobs N`` runs go to N worker processes of one thread each; wall-clock times are then
those of runs sharing the machine, alike for both algorithms.

The last line of output is one JSON object (benchmarks/README.md) with, per algorithm, the mean
held-out score before and after, its gain, the mean wall seconds, and
``maskgrpo_over_d1_gain_ratio``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# task -> (recipe per algorithm, the held-out score, scores reported beside it, greedy check)
TASKS: dict[str, tuple[dict[str, str], str, tuple[str, ...], bool]] = {
    "sudoku": (
        {"mask_grpo": "dllm_sudoku_maskgrpo", "diffu_grpo": "dllm_sudoku_d1"},
        "sudoku/solved",
        (),
        True,
    ),
    "compositional_discrete": (
        {"mask_grpo": "compositional_discrete_maskgrpo", "diffu_grpo": "compositional_discrete_d1"},
        "compositional",
        ("compositional/exact", "compositional/objects"),
        False,
    ),
}


def run(
    task: str, recipe: str, seed: int, iterations: int | None, eval_every: int, root: Path
) -> dict[str, Any]:
    """Train one recipe; returns its held-out curve ``[(iteration, seconds, score)]``."""
    import torch

    from genrl import Trainer, get_recipe
    from genrl.reporting.metrics import read_metrics

    torch.set_num_threads(1)  # also in spawned workers

    config = get_recipe(recipe)
    overrides = [
        f"seed={seed}",
        f"eval.every={eval_every}",
        f"output_dir={root / f'{recipe}-{seed}'}",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
        "logging.log_every=1000",
    ]
    if iterations:
        overrides.append(f"train.iterations={iterations}")
    config.apply_overrides(overrides)
    _, score, beside, greedy = TASKS[task]
    trainer = Trainer(config)
    greedy_before = greedy_score(trainer, score) if greedy else None
    started = time.perf_counter()
    summary = trainer.train()
    wall = time.perf_counter() - started
    greedy_after = greedy_score(trainer, score) if greedy else None
    curve, elapsed = [], 0.0
    for row in read_metrics(Path(config.output_dir) / "metrics.jsonl"):
        elapsed += row.get("time/iteration_s", 0.0)
        if f"eval/{score}" in row:
            curve.append((int(row["iteration"]), round(elapsed, 1), round(row[f"eval/{score}"], 4)))
    before, after = summary["heldout_scores_before"], summary["heldout_scores_after"]
    return {
        "before": before[score],
        "after": after[score],
        "beside": {name: (before[name], after[name]) for name in beside},
        "greedy_before": greedy_before,
        "greedy_after": greedy_after,
        "wall_seconds": wall,
        "curve": curve,
    }


def greedy_score(trainer: Any, score: str) -> float:
    """Held-out ``score`` of greedy decoding (temperature 0, one completion per prompt), next
    to the recipe's own held-out metric (sampled pass@1); the trainer is left as it was."""
    import copy

    config, rollout = trainer.config, trainer.rollout
    greedy = copy.deepcopy(config)
    greedy.generation.eval_temperature = 0.0
    greedy.eval.samples_per_prompt = 1
    trainer.config, trainer.rollout = greedy, type(rollout)(greedy)
    try:
        return float(trainer.evaluate().scores[score])
    finally:
        trainer.config, trainer.rollout = config, rollout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="sudoku")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=None, help="default: the recipes'")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, one thread each")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [
            (algorithm, (args.task, recipe, seed, args.iterations, args.eval_every, Path(tmp)))
            for algorithm, recipe in TASKS[args.task][0].items()
            for seed in args.seeds
        ]
        if args.jobs > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
                futures = [(a, pool.submit(run, *job)) for a, job in jobs]
                outcomes = [(a, f.result()) for a, f in futures]
        else:
            outcomes = [(a, run(*job)) for a, job in jobs]
        for algorithm, outcome in outcomes:
            results.setdefault(algorithm, []).append(outcome)
    _, score, beside, greedy = TASKS[args.task]
    extra = "greedy" if greedy else " ".join(name.split("/")[-1] for name in beside)
    print(
        f"{'algorithm':<12} {'seed':>4} {score + ' before':>22} {'after':>7} {extra:>22} "
        f"{'wall s':>7}  curve (it, s, score)"
    )
    headline: dict[str, Any] = {"benchmark": "dllm_estimators", "task": args.task,
                                "score": score, "seeds": args.seeds}  # fmt: skip
    for algorithm, runs in results.items():
        for seed, r in zip(args.seeds, runs, strict=True):
            pairs = [(r["greedy_before"], r["greedy_after"])] if greedy else r["beside"].values()
            shown = " ".join(f"{b:.3f}->{a:.3f}" for b, a in pairs)
            print(
                f"{algorithm:<12} {seed:>4} {r['before']:>22.3f} {r['after']:>7.3f} {shown:>22} "
                f"{r['wall_seconds']:>7.0f}  {r['curve']}"
            )
        gains = [r["after"] - r["before"] for r in runs]
        headline[algorithm] = {
            "score_before": statistics.mean(r["before"] for r in runs),
            "score_after": statistics.mean(r["after"] for r in runs),
            "gain_mean": statistics.mean(gains),
            "gain_std": statistics.pstdev(gains),
            "wall_seconds_mean": statistics.mean(r["wall_seconds"] for r in runs),
            "curves": [r["curve"] for r in runs],
        }
        if greedy:
            for key in ("greedy_before", "greedy_after"):
                headline[algorithm][key] = statistics.mean(r[key] for r in runs)
        for name in beside:
            headline[algorithm][name] = [r["beside"][name] for r in runs]
    d1_gain = headline["diffu_grpo"]["gain_mean"]
    headline["maskgrpo_over_d1_gain_ratio"] = (
        headline["mask_grpo"]["gain_mean"] / d1_gain if d1_gain else None
    )
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
