"""``metrics.jsonl`` stays one row per event across resumes and torn writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import tiny_config, tiny_overrides

from genrl import Trainer
from genrl.cli.main import main
from genrl.reporting.metrics import MetricsError, read_metrics


def _iterations(run: Path) -> list[int]:
    return [row["iteration"] for row in read_metrics(run / "metrics.jsonl")]


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
def test_resuming_a_finished_run_writes_the_final_evaluation_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    Trainer(tiny_config(tmp_path), run_dir=run).train()
    assert _iterations(run) == [0, 1, 2, 2]
    Trainer(tiny_config(tmp_path), run_dir=run, resume_from=run).train()
    assert _iterations(run) == [0, 1, 2, 2]
    # Extending it: the old final evaluation at 2 goes, as in an uninterrupted 3-iteration run.
    longer = tiny_config(tmp_path, "train.iterations=3")
    Trainer(longer, run_dir=run, resume_from=run).train()
    assert _iterations(run) == [0, 1, 2, 3, 3]


def test_resume_drops_a_torn_last_metrics_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = tiny_config(tmp_path, "train.iterations=3")
    Trainer(config, run_dir=run).train(stop_after=2)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 3, "reward/mean": 0.5, "rew')  # the disk filled up mid-line
    assert _iterations(run) == [0, 1, 2]  # readers skip the torn tail too
    Trainer(tiny_config(tmp_path, "train.iterations=3"), run_dir=run, resume_from=run).train()
    assert _iterations(run) == [0, 1, 2, 3, 3]


def test_a_corrupt_line_before_the_last_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    Trainer(tiny_config(tmp_path, "train.iterations=3"), run_dir=run).train(stop_after=2)
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1][:20] + "\n"
    path.write_text("".join(lines))
    with pytest.raises(MetricsError, match=rf"^{path}: line 2 is not valid JSON \("):
        read_metrics(path)
    sets = [arg for value in tiny_overrides(tmp_path) for arg in ("--set", value)]
    assert main(["train", "--resume", str(run), *sets, "--set", "train.iterations=3"]) == 2
    err = capsys.readouterr().err
    assert f"genrl: error: {path}: line 2 is not valid JSON" in err


def test_mean_accumulator_reads_tensors_back_once() -> None:
    """Loss metrics stay 0-dim tensors through the minibatches; ``means`` converts them (and
    plain numbers) to floats at the end."""
    import torch

    from genrl.reporting.metrics import MeanAccumulator, to_floats

    tracker = MeanAccumulator()
    tracker.add({"loss/a": torch.tensor(1.0), "lr": 0.5})
    tracker.add(
        {"loss/a": torch.tensor(2.0), "lr": 1.5, "loss/b": torch.tensor(4, dtype=torch.int64)}
    )
    means = tracker.means()
    assert means == {"loss/a": 1.5, "lr": 1.0, "loss/b": 4.0}
    assert all(type(v) is float for v in means.values())
    assert to_floats({"x": torch.tensor(0.25), "y": 3}) == {"x": 0.25, "y": 3.0}
