"""The default job on the embedded task, through the CLI: the held-out reward rises and the run
directory holds everything a person looks at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genrl.cli.main import main

pytestmark = (
    pytest.mark.slow
)  # 20 iterations of the default job (the fast lane has the golden curves)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("e2e") / "run"
    # The default recipe, shortened: 20 of its 60 iterations and a smaller held-out set.
    code = main(
        [
            "train",
            "--output-dir", str(out),
            "--set", "train.iterations=20",
            "--set", "eval.samples_per_prompt=8",
            "--set", "eval.every=10",
            "--set", "logging.progress_bar=false",
        ]
    )  # fmt: skip
    assert code == 0
    return out


def test_default_job_raises_heldout_reward(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["recipe"] == "digits_flow_grpo"
    assert 0.3 < summary["heldout_reward_before"] < 0.8
    assert summary["heldout_reward_after"] > summary["heldout_reward_before"] + 0.1
    assert summary["optimizer_steps"] > 0 and summary["wall_seconds"] > 0


def test_run_directory_contents(run_dir: Path) -> None:
    for name in ("config.json", "metrics.jsonl", "summary.json", "reward_curve.png",
                 "samples_before.png", "samples_after.png", "samples_before_after.png"):  # fmt: skip
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert list((run_dir / "checkpoints").glob("iter_000020/trainable.safetensors"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if "eval/reward" in r] == [0, 10, 20]


def test_resume_extends_a_finished_run(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--resume", str(run_dir), "--set", "train.iterations=22",
                 "--set", "logging.progress_bar=false"])  # fmt: skip
    assert code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 22
    assert "resuming run" in capsys.readouterr().out


def test_eval_sample_and_list(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", "--checkpoint", str(run_dir), "--set", "eval.samples_per_prompt=4"]) == 0
    assert "held-out reward" in capsys.readouterr().out
    out = tmp_path / "grid.png"
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt", "the number 3",
                 "-n", "3", "--out", str(out)]) == 0  # fmt: skip
    assert out.is_file()
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    for name in ("digits_flow_grpo", "flow_grpo", "toy_digits", "digit_classifier", "flow_sde"):
        assert name in listing
