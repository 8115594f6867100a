"""The CLI's messages are true: what Ctrl-C leaves behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import tiny_overrides

from genrl import Trainer
from genrl.cli import main


def _sets(tmp_path: Path, *extra: str) -> list[str]:
    return [arg for value in (*tiny_overrides(tmp_path), *extra) for arg in ("--set", value)]


def _ctrl_c_at(monkeypatch: pytest.MonkeyPatch, iteration: int) -> None:
    """Ctrl-C pressed twice (an immediate abort) while ``iteration`` is being trained."""
    real = Trainer.train_iteration

    def train_iteration(self: Trainer) -> dict[str, float]:
        if self.iteration == iteration:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(Trainer, "train_iteration", train_iteration)


def test_ctrl_c_names_the_latest_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    _ctrl_c_at(monkeypatch, 2)
    sets = _sets(tmp_path, "train.iterations=3", "logging.checkpoint_every=1")
    assert main(["train", "--output-dir", str(run), *sets]) == 130
    err = capsys.readouterr().err
    latest = run / "checkpoints" / "iter_000002"
    assert latest.is_dir()
    assert f"the latest checkpoint is {latest} (iteration 2)" in err
    assert f"--resume {run}" in err


def test_ctrl_c_before_the_first_checkpoint_says_there_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    _ctrl_c_at(monkeypatch, 0)
    assert main(["train", "--output-dir", str(run), *_sets(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert not (run / "checkpoints").exists()
    assert f"{run} holds no checkpoint" in err and "--resume" not in err
    assert "--overwrite" in err  # how to start it again in the same directory


def test_ctrl_c_stops_the_reward_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from reward_models.server import RewardServer

    def interrupted(self: RewardServer) -> None:
        self.shutdown()
        raise KeyboardInterrupt

    monkeypatch.setattr(RewardServer, "serve_forever", interrupted)
    assert main(["serve-reward", "digit_classifier", "--port", "0"]) == 0
    captured = capsys.readouterr()
    assert "stopped serving reward 'digit_classifier'" in captured.err
    assert "checkpoint" not in captured.out + captured.err


def test_sample_without_prompts_names_the_ones_it_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "grid.png"
    assert main(["sample", *_sets(tmp_path), "-n", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    from pipelines.toy.prompts import ALL_PROMPTS  # the digits task's held-out prompts

    head = ", ".join(repr(p) for p in ALL_PROMPTS[:8])
    count = len(ALL_PROMPTS)
    assert f"no --prompt given: sampling the recipe's {count} held-out prompts: {head}" in printed
    assert out.is_file()


def test_list_shows_every_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for title in ("recipes:", "algorithms:", "policies:", "rewards:", "samplers:"):
        assert title in out
    assert "[needs GPU]: too large for a CPU" in out
    listing = " ".join(out.split())
    # Policies and rewards are described by their docstrings, read without importing them.
    assert "digit_classifier ``digit_classifier`` = softmax probability of the prompt's digit" in (
        listing
    )
    assert "toy_digits Class-conditional 8x8 digit generator" in listing
