"""``benchmarks/allocation.py``'s bookkeeping by hand: the iterations each method's budget buys,
seed-mean curves, samples to a target and the rollout ratios against GRPO."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import allocation as bench


def test_each_method_gets_the_iterations_its_budget_buys() -> None:
    countdown = bench.TASKS["countdown"]
    assert bench.iterations_for("grpo", countdown, 25_600) == 100  # 32 x 8 per iteration
    # Pilot-Commit: 96 pilot samples in the first round, then 192 per iteration
    assert bench.iterations_for("pilot_commit", countdown, 25_600) == 1 + (25_600 - 288) // 192
    # sGPO: the 8,000-sample profile first, then GRPO's 256 per iteration
    assert bench.iterations_for("sorted_groups", countdown, 25_600) == (25_600 - 8_000) // 256
    assert bench.iterations_for("adaptive_rollouts", countdown, 25_600) == 25_600 // (32 * 6)
    assert bench.iterations_for("grpo", countdown, 10) == 1


def _run(method: str, seed: int, curve: list[list[float]]) -> dict:
    return {
        "method": method,
        "seed": seed,
        "curve": curve,
        "after": curve[-1][2],
        "samples": curve[-1][1],
        "seconds": 1.0,
    }


def test_ratios_compare_samples_to_grpo_targets() -> None:
    results = [
        _run("grpo", 0, [[0, 0, 0.3], [10, 100, 0.5], [20, 200, 0.6]]),
        _run("grpo", 1, [[0, 0, 0.3], [10, 100, 0.3], [20, 200, 0.4]]),
        # reaches GRPO's 90%-gain target (0.3 + 0.9 x 0.2 = 0.48) at 50 samples, seed mean
        _run("pilot_commit", 0, [[0, 0, 0.3], [5, 50, 0.5], [10, 90, 0.5]]),
        _run("pilot_commit", 1, [[0, 0, 0.3], [5, 50, 0.5], [10, 110, 0.52]]),
    ]
    summary = bench.summarise(results)
    assert abs(summary["targets"]["grpo_final"] - 0.5) < 1e-12
    assert abs(summary["targets"]["grpo_90pct_gain"] - 0.48) < 1e-12
    grpo, pilot = summary["methods"]["grpo"], summary["methods"]["pilot_commit"]
    assert grpo["samples_to_grpo_90pct_gain"] == 200 and grpo["ratio_to_grpo_90pct_gain"] == 1
    assert pilot["samples_to_grpo_90pct_gain"] == 50
    assert pilot["ratio_to_grpo_90pct_gain"] == 200 / 50
    assert pilot["samples_to_grpo_final"] == 50 and abs(pilot["after"] - 0.51) < 1e-12
    assert bench.samples_to([(0, 0.1), (5, 0.2)], 0.3) is None
