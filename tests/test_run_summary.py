"""What a run prints when it ends: a per-prompt table short enough to keep the summary on the
screen (every prompt in ``per_prompt.txt``), the task's headline score next to the reward, and
labels that say what was evaluated (held-out prompts, or the training prompts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny import tiny_overrides

from genrl import GRPOTrainer
from genrl.cli.main import main
from genrl.reporting.report import PRINTED_PROMPTS, closing_line, printed_table
from pipelines.transformers.causal_lm import EMBEDDED_COUNTDOWN_LM
from reward_models import CompositeReward
from reward_models.digits import DigitClassifierReward
from reward_models.text import CountdownReward, ShapesVQAReward, SudokuReward
from tasks.countdown import HELDOUT_PROBLEMS, make_problems

# Twelve digit prompts in a file: more rows than are printed, and no held-out set.
PROMPTS = [f"a handwritten digit {d}" for d in range(10)] + ["the number 3", "the number 7"]


def _closing_lines(printed: list[str]) -> tuple[list[str], str, str]:
    """(the printed table, from its first line to the mean row; the protocol line; the last
    line) of a run's output."""
    start = next(i for i, line in enumerate(printed) if line.startswith(("prompt ", "10 of ")))
    end = next(i for i, line in enumerate(printed) if line.startswith("mean "))
    return printed[start : end + 1], printed[end + 1], printed[-1]


def test_printed_table_is_capped_and_a_prompt_file_is_not_called_held_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    run = tmp_path / "run"
    sets = [*tiny_overrides(tmp_path), f"prompts.dataset={prompts}", "train.iterations=1"]
    assert main(["train", *(a for s in sets for a in ("--set", s)), "--output-dir", str(run)]) == 0
    table, protocol, last = _closing_lines(capsys.readouterr().out.splitlines())
    # A note naming the file, the header and its rule, 10 prompts, a rule and the mean.
    assert len(table) == 1 + 2 + PRINTED_PROMPTS + 2 == 15
    whole = run / "per_prompt.txt"
    assert table[0] == (
        f"10 of 12 prompts (the 5 largest rises, the 5 largest falls); every prompt: {whole}"
    )
    assert len(whole.read_text().splitlines()) == 2 + 12 + 2  # every prompt is in the file
    summary = json.loads((run / "summary.json").read_text())
    before, after = summary["heldout_per_prompt_before"], summary["heldout_per_prompt_after"]
    change = {p: after[p] - before[p] for p in before}
    ranked = sorted(change, key=lambda p: change[p], reverse=True)  # stable: file order on ties
    shown = [line[: line.rindex("  ", 0, -25)].rstrip() for line in table[3:13]]
    assert shown == ranked[:5] + ranked[-5:]
    assert table[-1].split()[-3:] == [
        f"{sum(before.values()) / 12:.3f}",
        f"{sum(after.values()) / 12:.3f}",
        f"{sum(after.values()) / 12 - sum(before.values()) / 12:+.3f}",
    ]
    # Evaluated on the training prompts: no label calls the numbers held-out.
    assert summary["evaluated_on"] == "training prompts"
    assert protocol.startswith("held-out prompts: evaluated on training prompts: no held-out")
    reward = f"{summary['heldout_reward_before']:.3f} -> {summary['heldout_reward_after']:.3f}"
    assert last.startswith(f"reward on the training prompts: {reward} (")
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "held-out reward" not in page and "held-out digit_classifier" not in page
    assert "<th>reward on the training prompts</th>" in page
    assert "Per prompt (mean on the training prompts)" in page


def test_a_short_table_is_printed_whole() -> None:
    before = {"a": 0.5, "b": 0.25}
    table = printed_table(before, {"a": 0.75, "b": 0.0}, "reward", Path("run/per_prompt.txt"))
    assert table.splitlines() == [
        "prompt   before    after   change",
        "---------------------------------",
        "a         0.500    0.750   +0.250",
        "b         0.250    0.000   -0.250",
        "---------------------------------",
        "mean reward    0.375    0.375   +0.000",
    ]


def test_rewards_name_their_headline_scores() -> None:
    assert CompositeReward([(CountdownReward(), 1.0)]).headlines == ["countdown/accuracy"]
    assert CompositeReward([(ShapesVQAReward(), 1.0)]).headlines == ["shapes_vqa/accuracy"]
    assert CompositeReward([(SudokuReward(), 1.0)]).headlines == ["sudoku/solved"]
    # The digit classifier's probability is what its task is stated in: no other headline.
    assert CompositeReward([(DigitClassifierReward(), 1.0)]).headlines == []


def test_closing_line_quotes_the_headline_before_the_reward() -> None:
    changes = [("held-out countdown/accuracy", 0.37, 0.395), ("held-out reward", 0.433, 0.4555)]
    assert closing_line(changes, 200, 3.2, Path("runs/x")) == (
        "held-out countdown/accuracy: 0.370 -> 0.395 (+0.025); held-out reward: 0.433 -> "
        "0.456 (+0.023) on 200 samples; 3 s; outputs in runs/x"
    )


@pytest.mark.slow
def test_countdown_run_prints_its_accuracy_and_ten_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    sets = ["train.iterations=1", "train.prompts_per_iteration=2", "train.group_size=2"]
    sets += ["logging.progress_bar=false", "logging.tensorboard=false"]
    argv = ["train", "llm_countdown_grpo", *(a for s in sets for a in ("--set", s))]
    assert main([*argv, "--output-dir", str(run)]) == 0
    table, _, last = _closing_lines(capsys.readouterr().out.splitlines())
    assert len(table) == 15 and table[0].startswith(
        f"10 of {HELDOUT_PROBLEMS} prompts"
    )  # all of them
    summary = json.loads((run / "summary.json").read_text())
    assert summary["headline_scores"] == ["countdown/accuracy"]
    assert summary["samples_generated"] == summary["samples_seen"] == 4  # uniform: 2 x 2
    accuracy = summary["heldout_scores_after"]["countdown/accuracy"]
    before = summary["heldout_scores_before"]["countdown/accuracy"]
    assert last.startswith(f"held-out countdown/accuracy: {before:.3f} -> {accuracy:.3f} (")
    # On the first 200 of them, the shipped model's greedy accuracy as its manifest records.
    manifest = json.loads((EMBEDDED_COUNTDOWN_LM / "manifest.json").read_text())
    first = [p.prompt for p in make_problems(200, 0, "heldout")]
    solved = sum(summary["heldout_per_prompt_before"][p] == 1.0 for p in first)
    assert solved / 200 == pytest.approx(manifest["metrics"]["heldout"]["greedy_accuracy"])
    assert f"; held-out reward: {summary['heldout_reward_before']:.3f} -> " in last


@pytest.mark.slow
def test_grpo_trainer_without_an_eval_set_says_it_evaluated_the_training_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.set_num_threads(1)
    rows = [{"prompt": p.prompt, "target": p.target} for p in make_problems(4, 0, "train")]
    trainer = GRPOTrainer(
        model="countdown_lm",
        reward_funcs=["countdown"],
        args={
            "max_steps": 1,
            "num_generations": 2,
            "train.prompts_per_iteration": 2,
            "eval.samples_per_prompt": 1,
            "logging.progress_bar": False,
            "report_to": "none",
            "output_dir": str(tmp_path / "run"),
        },
        train_dataset=rows,
    )
    summary = trainer.train()
    assert summary["evaluated_on"] == "training prompts"
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("countdown/accuracy on the training prompts: ")
    assert "; reward on the training prompts: " in last and "held-out" not in last
