"""``benchmarks/compositional.py``: its smoke runs (both tracks, the tuning path), its figures on
made-up curves, its cache names against the committed cache, and the tuning selection by hand."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tasks.compositional import is_validation, parse_prompt
from tests.test_benchmarks import ROOT, run_benchmark

sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import compositional
    import compositional_runs
    import compositional_tuning
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

COMMITTED = ROOT / "benchmarks" / "results" / "compositional_it200"
CATEGORIES = {"single_object", "two_object", "counting", "colors", "position", "color_attr"}


@pytest.mark.slow  # trains two methods on two tracks, then reruns from the cache: about 40 s
def test_quick_ends_with_its_json_line_and_reuses_finished_runs(tmp_path: Path) -> None:
    out = ("--output-dir", str(tmp_path))
    summary = run_benchmark("compositional.py", "--quick", *out)
    assert summary["benchmark"] == "compositional"
    settings = summary["settings"]
    assert settings["methods"] == ["flow_grpo", "diffusion_nft"] and settings["seeds"] == [0]
    assert settings["tracks"] == ["geneval", "strict"] and summary["runs_trained"] == 4
    for track, part in summary["tracks"].items():
        assert part["score"] == {"geneval": "geneval", "strict": "exact"}[track]
        for method, row in part["methods"].items():
            required = {"final", "final_exact", "final_std", "settings", "steps_to_flow_grpo_best"}
            assert required | {"diversity_change", "steps_to_90pct_gain"} <= set(row)
            assert 0.0 <= row["final_exact"] <= row["final"] <= 1.0  # exact implies correct
            assert row["final_std"] == row["final_exact_std"] == 0.0  # one seed
            assert set(row["per_category"]) == set(row["per_category_exact"]) == CATEGORIES
            assert row["settings"]["source"] == "recipe" and row["settings"]["lr"] == 5e-5
            assert row["samples_drawn"] == 2 * 4 * 8, method  # 2 iterations of 4 prompts x 8
        flow = part["methods"]["flow_grpo"]
        if part["flow_grpo_gained"]:  # Flow-GRPO reaches its own best, by definition
            assert flow["steps_to_flow_grpo_best_ratio"] == 1.0
        else:  # nothing to reach: null, not a number
            assert flow["steps_to_flow_grpo_best"] is None
    assert (tmp_path / "curves.png").stat().st_size > 0
    names = sorted(p.name for p in (tmp_path / "results").glob("*.json"))
    assert names == [
        "diffusion_nft-seed0-it2-ev1-quick.json", "diffusion_nft-strict-seed0-it2-ev1-quick.json",
        "flow_grpo-seed0-it2-ev1-quick.json", "flow_grpo-strict-seed0-it2-ev1-quick.json",
    ]  # fmt: skip
    strict = json.loads((tmp_path / "results" / names[3]).read_text())
    # The strict run trained on exact: its primary held-out score is exact, correct is logged.
    assert strict["after"]["compositional"] == strict["after"]["compositional/exact"]
    assert strict["final"] == strict["after"]["compositional/correct"]
    assert not list((tmp_path / "runs").iterdir())  # run directories go once cached
    again = run_benchmark("compositional.py", "--quick", *out)
    assert again["runs_trained"] == 0 and again["runs_cached"] == 4
    assert again["tracks"] == summary["tracks"]


@pytest.mark.slow  # nine tuning runs and one reported run: about a minute
def test_quick_tune_selects_on_validation_and_trains_the_choice(tmp_path: Path) -> None:
    summary = run_benchmark("compositional.py", "--quick", "--tune", "--output-dir", str(tmp_path))
    assert summary["settings"]["tune"] and summary["settings"]["tune_seeds"] == [100]
    record = summary["tracks"]["geneval"]["tuning"]["flow_grpo"]
    assert len(record["grid"]) == 9 and record["knob"] == "sampler.noise_level"
    best = max(point["validation"] for point in record["grid"])
    chosen = record["selected"]
    assert any(
        point["validation"] == best
        and (point["lr_factor"], point["value"]) == tuple(chosen.values())
        for point in record["grid"]
    )
    row = summary["tracks"]["geneval"]["methods"]["flow_grpo"]
    assert row["settings"]["lr_factor"] == chosen["lr_factor"]
    assert row["settings"]["sampler.noise_level"] == chosen["value"]
    assert row["settings"]["lr"] == pytest.approx(5e-5 * chosen["lr_factor"])
    tuned = sorted(p.name for p in (tmp_path / "results").glob("tune-*.json"))
    assert len(tuned) == 9 and all("-seed100-" in name for name in tuned)
    assert all(json.loads((tmp_path / "results" / n).read_text())["tuning"] for n in tuned)
    # Tuning runs are scored on the validation prompts, never on the held-out ones: the run's
    # report lists the prompts it evaluated.
    for name in tuned:
        log = (tmp_path / "logs" / name.replace(".json", ".log")).read_text()
        assert "held-out prompts: 22 validation prompts" in log
        listed = [line[:48].strip() for line in log.splitlines() if line.startswith("a photo")]
        assert listed and all(is_validation(parse_prompt(p).key) for p in listed), listed


def test_summary_by_hand() -> None:
    """Thresholds and ratios on made-up curves ``[iteration, steps, seconds, score, exact]``:
    Flow-GRPO's seed-mean GenEval curve is (0, 0 s, 0.4), (55, 11 s, 0.7), (105, 21 s, 0.7),
    so its best is 0.7 at 55 steps and 90% of its gain 0.4 + 0.9 x 0.3 = 0.67, also at 55. On
    the strict track the exact column counts: Flow-GRPO's best exact is its start, 0.3."""

    def run(seed: int, curve: list[list[float]], final: float, diversity: float) -> dict:
        scores = {"sample_diversity": 0.18, "compositional/exact": 0.3}
        return {
            "recipe": "r", "seed": seed, "curve": curve, "final": final, "final_exact": 0.2,
            "before": scores, "after": {**scores, "sample_diversity": diversity},
            "optimizer_steps": curve[-1][1], "fill_seconds": 0.0,
            "samples_seen": 256, "offline_samples": 0,
        }  # fmt: skip

    results = {
        "flow_grpo": [
            run(0, [[0, 0, 0, 0.4, 0.3], [10, 50, 10, 0.6, 0.2], [20, 100, 20, 0.7, 0.1]], 0.7, 0.22),
            run(1, [[0, 0, 0, 0.4, 0.3], [10, 60, 12, 0.8, 0.2], [20, 110, 22, 0.7, 0.1]], 0.5, 0.20),
        ],
        "ram": [run(0, [[0, 0, 0, 0.4, 0.3], [10, 80, 30, 0.65, 0.35], [20, 160, 60, 0.72, 0.3]], 0.72, 0.18)],
        "gdro": [run(0, [[0, 0, 0, 0.4], [10, 80, 30, 0.5], [20, 160, 60, 0.6]], 0.6, 0.17)],
    }  # fmt: skip
    summary = compositional.summarise(results)
    assert summary["flow_grpo_best"] == 0.7 and summary["gain90_target"] == 0.67
    flow, ram, gdro = (summary["table"][m] for m in ("flow_grpo", "ram", "gdro"))
    assert (flow["final"], flow["final_std"], flow["final_exact"]) == (0.6, 0.1, 0.2)
    assert (flow["steps_to_flow_grpo_best"], flow["seconds_to_flow_grpo_best"]) == (55, 11)
    assert flow["diversity_change"] == 0.03  # (0.04 + 0.02) / 2
    assert flow["steps_per_iteration"] == 5.25  # 105 steps / 20 iterations
    # RAM reaches 0.7 and 0.67 only at its last point: 160 steps / 55, 60 s / 11.
    assert (ram["steps_to_flow_grpo_best"], ram["seconds_to_flow_grpo_best"]) == (160, 60)
    assert ram["steps_to_flow_grpo_best_ratio"] == ram["steps_to_90pct_gain"] == 2.909
    assert ram["seconds_to_flow_grpo_best_ratio"] == ram["seconds_to_90pct_gain"] == 5.455
    # GDRO never gets there: null, not a number.
    assert gdro["steps_to_flow_grpo_best"] is None and gdro["seconds_to_flow_grpo_best"] is None
    assert gdro["steps_to_90pct_gain"] is None and gdro["diversity_change"] == -0.01
    # Strict track: Flow-GRPO's exact falls from 0.3, so it gains nothing and every "steps to"
    # is null; GDRO's points have no exact column (an old cache entry): no curve, no before.
    strict = compositional.summarise(results, "strict")
    assert strict["score"] == "exact" and strict["flow_grpo_best"] == 0.3
    assert not strict["flow_grpo_gained"]
    assert strict["table"]["ram"]["best"] == 0.35 and strict["table"]["gdro"]["before"] is None
    assert strict["table"]["ram"]["steps_to_flow_grpo_best"] is None


def test_committed_cache_reads_as_the_geneval_track_at_recipe_settings(tmp_path: Path) -> None:
    """The 30 runs under ``benchmarks/results/compositional_it200`` keep their names: a
    ``geneval`` run at the recipe's settings has the name they were written under."""
    for method in ("flow_grpo", "ram"):
        spec = compositional_runs.RunSpec(method, "geneval", 0, 200, 10)
        assert (COMMITTED / f"{spec.key()}.json").is_file(), spec.key()
        recipe = compositional_runs.recipe_setting(method)
        assert compositional_runs.RunSpec(method, "geneval", 0, 200, 10, setting=recipe).key() == (
            spec.key()
        )
        # Read through the benchmark: no training, the committed figures.
        shutil.copytree(COMMITTED, tmp_path / "results", dirs_exist_ok=True)
        result = compositional_runs.train_one(spec, tmp_path, keep=False)
        committed = json.loads((COMMITTED / f"{spec.key()}.json").read_text())
        assert result["cached"] and result["track"] == "geneval" and result["setting"] is None
        assert result["final"] == committed["final"]
        assert result["final_exact"] == committed["after"]["compositional/exact"]
    strict = compositional_runs.RunSpec("flow_grpo", "strict", 0, 200, 10).key()
    assert strict == "flow_grpo-strict-seed0-it200-ev10"
    tuned = compositional_runs.Setting(2.0, 0.9)
    assert compositional_runs.RunSpec("flow_grpo", "strict", 0, 200, 10, setting=tuned).key() == (
        "flow_grpo-strict-lr2-noise_level0.9-seed0-it200-ev10"
    )
    tune = compositional_runs.RunSpec("dgpo", "geneval", 100, 200, 10, False, None, True)
    assert tune.key() == "tune-dgpo-seed100-it200-ev10"
    assert "prompts.dataset=compositional_tuning" in tune.overrides(5e-5)


def _curve(*scores: float) -> list[list[float]]:
    return [[i, i, i, s, s / 2] for i, s in enumerate(scores)]


def test_selection_by_hand() -> None:
    """Fabricated validation curves: the score is the mean of each curve's last 3 points.

    (0.5, 10): last three 0.5, 0.6, 0.7 -> 0.60; (1, 10): 0.2, 0.9, 0.6 -> 0.5667, though its
    single best point is the highest; (2, 30): 0.6, 0.6, 0.6 -> 0.60, tied with (0.5, 10); the
    tie goes to the setting nearer the recipe's (1, 10): |log2 0.5| + 0 = 1 against |log2 2| +
    1 = 2, so (0.5, 10)."""
    curves = {
        (0.5, 10.0): _curve(0.3, 0.5, 0.6, 0.7),
        (1.0, 10.0): _curve(0.3, 0.2, 0.9, 0.6),
        (2.0, 30.0): _curve(0.3, 0.6, 0.6, 0.6),
        (1.0, 100.0): _curve(0.3, 0.1, 0.1, 0.1),
    }
    candidates = [
        (compositional_runs.Setting(*k), compositional_tuning.validation_score([c], 3))
        for k, c in curves.items()
    ]
    assert [round(v, 4) for _, v in candidates] == [0.6, 0.5667, 0.6, 0.1]
    default, values = compositional_runs.Setting(1.0, 10.0), (10.0, 30.0, 100.0)
    assert compositional_tuning.select(candidates, default, values) == (
        compositional_runs.Setting(0.5, 10.0)
    )
    # On the exact column (half of each score) the same pick; with two seeds the means count:
    # a second seed at 0.9 for (2, 30) lifts it to (0.6 + 0.9) / 2 = 0.75, the best.
    two = compositional_tuning.validation_score([curves[(2.0, 30.0)], _curve(0.9, 0.9, 0.9)], 3)
    assert two == pytest.approx(0.75)
    assert compositional_tuning.select(
        [*candidates[:2], (compositional_runs.Setting(2.0, 30.0), two)], default, values
    ) == compositional_runs.Setting(2.0, 30.0)
    # An exact tie with the recipe's own setting keeps the recipe's.
    assert (
        compositional_tuning.select(
            [(compositional_runs.Setting(2.0, 100.0), 0.5), (default, 0.5)], default, values
        )
        == default
    )


def test_grid_is_the_learning_rate_times_the_knob_for_every_method() -> None:
    for method in compositional.METHODS:
        points = compositional_tuning.grid(method)
        knob = compositional_runs.knob(method)
        assert len(points) == 9 == len(set(points))
        assert {p.lr_factor for p in points} == {0.5, 1.0, 2.0}
        assert {p.value for p in points} == set(knob.values)
        assert compositional_runs.recipe_setting(method) in points


def test_diagnosis_compares_each_method_with_flow_grpo_by_hand() -> None:
    """Made-up ``metrics.jsonl`` rows: evaluation rows (no ``time/iteration_s``) are left out;
    Flow-GRPO's clip fraction 0.1, 0.3 (mean 0.2) against DanceGRPO's 0.05, 0.05 (0.25 of it);
    GDRO logs no ratio: null, not 0."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import compositional_diagnose as diagnose
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def rows(clip: list[float] | None, units: list[float]) -> list[dict[str, float]]:
        out: list[dict[str, float]] = [{"iteration": 0, "eval/reward": 0.4}]
        for i, n in enumerate(units, start=1):
            row = {"iteration": i, "time/iteration_s": 1.0, "train_units": n}
            if clip is not None:
                row["loss/clip_fraction"] = clip[i - 1]
            out.append(row)
        out.append({"iteration": len(units), "eval/reward": 0.5})
        return out

    comparison = diagnose.compare({
        "flow_grpo": rows([0.1, 0.3], [100, 120]),
        "dance_grpo": rows([0.05, 0.05], [150, 180]),
        "gdro": rows(None, [32, 32]),
    })  # fmt: skip
    clip = comparison["loss/clip_fraction"]
    assert clip["flow_grpo"]["series"] == {1: 0.1, 2: 0.3}
    assert clip["flow_grpo"]["mean"] == pytest.approx(0.2)
    assert clip["dance_grpo"]["ratio_to_flow_grpo"] == 0.25
    assert clip["gdro"] == {"series": {}, "mean": None, "ratio_to_flow_grpo": None}
    units = comparison["train_units"]
    assert units["dance_grpo"]["ratio_to_flow_grpo"] == 1.5  # 165 / 110
    assert units["gdro"]["ratio_to_flow_grpo"] == round(32 / 110, 4)
    assert comparison["loss/log_prob_abs_mean"]["flow_grpo"]["mean"] is None


@pytest.mark.slow  # two short runs: about 20 s
def test_diagnosis_quick_reads_the_new_step_statistics(tmp_path: Path) -> None:
    summary = run_benchmark(
        "compositional_diagnose.py", "--quick", "--methods", "dance_grpo", "--output-dir",
        str(tmp_path),
    )  # fmt: skip
    quantities = summary["quantities"]
    for key in ("loss/ratio_mean", "loss/clip_fraction", "advantages/abs_mean",
                "reward/zero_std_fraction", "loss/approx_kl", "loss/log_prob_abs_mean",
                "loss/transition_std_mean"):  # fmt: skip
        assert set(quantities[key]["flow_grpo"]["series"]) == {"1", "2"}, key
    noise = quantities["loss/transition_std_mean"]
    # DanceGRPO's constant eta 0.3 injects less noise than Flow-GRPO's 0.7 on these steps.
    assert 0 < noise["dance_grpo"]["mean"] < noise["flow_grpo"]["mean"]
    assert (tmp_path / "runs" / "flow_grpo-seed0-it2-ev2-quick" / "metrics.jsonl").is_file()
