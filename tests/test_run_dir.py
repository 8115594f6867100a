"""The run directory holds one run: a fresh run refuses another run's directory unless told to
resume it or overwrite it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny import tiny_config, tiny_overrides

from genrl import Trainer
from genrl.checkpoints.run_dir import RunDirectoryError
from genrl.cli.main import main
from genrl.reporting.metrics import read_metrics


def _iterations(run: Path) -> list[int]:
    return [row["iteration"] for row in read_metrics(run / "metrics.jsonl")]


def _cli_train(tmp_path: Path, run: Path, *extra: str) -> int:
    sets = [arg for value in tiny_overrides(tmp_path) for arg in ("--set", value)]
    return main(["train", "--output-dir", str(run), *sets, *extra])


def test_a_fresh_run_refuses_a_directory_holding_a_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    Trainer(tiny_config(tmp_path), run_dir=run).train()
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(RunDirectoryError) as caught:
        Trainer(tiny_config(tmp_path), run_dir=run).train()
    message = str(caught.value)
    assert str(run) in message and "checkpoints/" in message and "summary.json" in message
    assert "--resume" in message and "--overwrite" in message and "\n" not in message
    assert (run / "metrics.jsonl").read_text() == before  # nothing was touched


def test_the_cli_refuses_before_building_and_overwrite_replaces_only_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    assert _cli_train(tmp_path, run, "--set", "train.iterations=3") == 0
    (run / "notes.txt").write_text("mine")
    (run / "checkpoints" / "iter_000007").mkdir()  # a stale checkpoint would sort last

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("the models were built before the directory was checked")

    monkeypatch.setattr("genrl.run.build.build_policy_from", no_build)
    assert _cli_train(tmp_path, run) == 2
    err = capsys.readouterr().err
    assert err.startswith("genrl: error: ") and err.count("\n") == 1
    assert "--resume" in err and "--overwrite" in err
    monkeypatch.undo()

    assert _cli_train(tmp_path, run, "--overwrite") == 0
    assert _iterations(run) == [0, 1, 2, 2]  # the new run's rows only
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000002"]
    assert json.loads((run / "summary.json").read_text())["iterations"] == 2
    assert (run / "notes.txt").read_text() == "mine"  # not the run's: left alone


def test_overwrite_and_resume_exclude_each_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--resume", str(tmp_path), "--overwrite"])
    assert exit_.value.code == 2
    assert "--overwrite: not allowed with argument --resume" in capsys.readouterr().err
    with pytest.raises(ValueError, match="cannot resume"):
        Trainer(tiny_config(tmp_path), resume_from=tmp_path, overwrite=True)


def test_unrelated_files_do_not_make_a_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    Trainer(tiny_config(tmp_path), run_dir=run).train()
    assert (run / "notes.txt").read_text() == "mine"
    assert _iterations(run) == [0, 1, 2, 2]


def test_training_on_in_memory_and_evaluating_a_finished_run_are_allowed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    trainer = Trainer(tiny_config(tmp_path, "train.iterations=3"), run_dir=run)
    trainer.train(stop_after=1)
    trainer.train()  # the same Trainer continues its own run
    assert _iterations(run) == [0, 1, 2, 3, 3]
    Trainer(tiny_config(tmp_path), run_dir=run).evaluate()  # writes nothing: no refusal
