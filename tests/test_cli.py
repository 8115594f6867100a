"""The CLI's messages are true: what Ctrl-C leaves behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import tiny_overrides

from genrl import Trainer
from genrl.cli.main import main


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
    from reward_models.serving.server import RewardServer

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
    from tasks.digits import ALL_PROMPTS  # the digits task's held-out prompts

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


DIGITS_PROTOCOL = (
    "held-out prompts: 10 prompts, one per digit, in a wording no training prompt uses; the "
    "model reads only the digit label, so what is held out for it are the noise seeds; seed "
    "protocol: 10 prompts x 2 samples per prompt, eval seed 7, the deterministic ODE sampler, "
    "4 steps, from seeded noise"
)


def test_summary_and_closing_table_state_the_heldout_protocol(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    run = tmp_path / "run"
    args = ["train", *_sets(tmp_path, "train.iterations=1", "eval.seed=7"), "--output-dir"]
    assert main([*args, str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["heldout_protocol"] == DIGITS_PROTOCOL
    printed = capsys.readouterr().out.splitlines()
    table_end = next(i for i, line in enumerate(printed) if line.startswith("mean "))
    assert printed[table_end + 1] == DIGITS_PROTOCOL  # right under the before/after table
    page = (run / "report.html").read_text(encoding="utf-8")
    assert page.count(f'<p class="protocol">{DIGITS_PROTOCOL}</p>') == 2  # summary, per prompt


def test_a_prompt_file_says_it_has_no_heldout_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "mine.txt"
    prompts.write_text("a handwritten digit three\nthe number 7\n")
    sets = _sets(tmp_path, f"prompts.dataset={prompts}", "eval.samples_per_prompt=1")
    assert main(["eval", *sets]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "held-out prompts: evaluated on training prompts: no held-out set given; seed protocol: "
        "2 prompts x 1 sample per prompt, eval seed 1234, the deterministic ODE sampler, "
        "4 steps, from seeded noise"
    )
