"""``benchmarks/multi_reward.py``: its summary and curve reading by hand, and (slow lane) a
quick run that ends with its JSON line and reuses its cached runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import multi_reward


def _run(method: str, seed: int, curve: list[list[float]], negative: float) -> dict[str, Any]:
    return {
        "method": method,
        "seed": seed,
        "curve": curve,
        "worst_negative_fraction": negative,
        "worst_cosine": -0.1 if negative else 0.3,
        "cosines": {"compositional": 0.5, "compositional_artifact_probe": 0.1},
        "weights": {"compositional": None, "compositional_artifact_probe": None},
        "seconds": 10.0,
    }


def test_summary_by_hand() -> None:
    base = [
        _run("weighted_sum", 0, [[0, 0, 1.0, 0.4, 0.6], [1, 128, 1.1, 0.5, 0.6], [2, 256, 1.2, 0.6, 0.6]], 0.5),
        _run("weighted_sum", 1, [[0, 0, 1.0, 0.4, 0.6], [1, 128, 1.1, 0.5, 0.6], [2, 256, 1.0, 0.4, 0.6]], 0.25),
    ]  # fmt: skip
    marble = [
        _run("marble", 0, [[0, 0, 1.0, 0.4, 0.6], [1, 128, 1.3, 0.6, 0.7], [2, 256, 1.4, 0.6, 0.8]], 0.0),
    ]  # fmt: skip
    summary = multi_reward.summarise({"weighted_sum": base, "marble": marble})
    ws = summary["methods"]["weighted_sum"]
    # Finals: composite (1.2 + 1.0) / 2, std 0.1; score (0.6 + 0.4) / 2.
    assert ws["composite"] == pytest.approx(1.1) and ws["composite_std"] == pytest.approx(0.1)
    assert ws["compositional"] == pytest.approx(0.5)
    assert ws["worst_negative_fraction"] == pytest.approx(0.375)
    # The baseline's seed-mean curve peaks at 1.1 (iterations 1 and 2), first at 128 samples;
    # MARBLE's first point at or above 1.1 is also at 128: ratio 1.
    assert summary["rollouts_to_baseline_best"] == pytest.approx(1.0)
    assert summary["methods"]["marble"]["composite"] == pytest.approx(1.4)


def test_reading_a_run_by_hand() -> None:
    rows = [
        {"iteration": 0, "eval/reward": 1, "eval/compositional/correct": 0.4, "eval/artifact_probe": 0.5},
        {"iteration": 1, "loss/balance/worst_negative": 0.5, "loss/balance/worst_cosine": -0.2,
         "loss/balance/cosine/compositional": 0.4, "loss/balance/cosine/compositional_artifact_probe": -0.2,
         "loss/balance/weight/compositional": 0.7, "loss/balance/weight/compositional_artifact_probe": 0.3},
        {"iteration": 2, "loss/balance/worst_negative": 0.0, "loss/balance/worst_cosine": 0.2,
         "loss/balance/cosine/compositional": 0.6, "loss/balance/cosine/compositional_artifact_probe": 0.2,
         "loss/balance/weight/compositional": 0.5, "loss/balance/weight/compositional_artifact_probe": 0.5,
         "eval/reward": 1, "eval/compositional/correct": 0.5, "eval/artifact_probe": 0.7},
        {"iteration": 2, "eval/reward": 1, "eval/compositional/correct": 0.6, "eval/artifact_probe": 0.7},
    ]  # fmt: skip
    run = multi_reward.read_run(rows, samples_per_iteration=128)
    # The final evaluation's own row replaces the point of the same iteration.
    assert run["curve"] == [[0, 0, 0.9, 0.4, 0.5], [2, 256, pytest.approx(1.3), 0.6, 0.7]]
    assert run["worst_negative_fraction"] == 0.25
    assert run["worst_cosine"] == pytest.approx(0.0)
    assert run["cosines"]["compositional_artifact_probe"] == pytest.approx(0.0)
    assert run["weights"]["compositional"] == pytest.approx(0.6)


@pytest.mark.slow
def test_quick_ends_with_its_json_line_and_reuses_finished_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert multi_reward.main(["--quick", "--output-dir", str(tmp_path)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["runs_trained"] == 2 and set(line["methods"]) == {"weighted_sum", "marble"}
    assert 0 <= line["methods"]["marble"]["worst_negative_fraction"] <= 1
    assert multi_reward.main(["--quick", "--output-dir", str(tmp_path)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["runs_cached"] == 2 and line["runs_trained"] == 0
