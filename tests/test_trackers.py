"""Experiment trackers: TRL's metric names, and what each tracker writes in offline mode."""

from __future__ import annotations

import json
import math
import sqlite3
import sys
from pathlib import Path

import pytest
import torch

from genrl import Trainer, get_recipe
from genrl.config.errors import ConfigError
from genrl.reporting.trackers import check_report_to, trl_names

TINY = [
    "train.iterations=2",
    "train.prompts_per_iteration=4",
    "train.group_size=4",
    "eval.samples_per_prompt=2",
    "logging.progress_bar=false",
]
# The names the issue lists (TRL's GRPOTrainer logs them under these names).
TRL_TOKEN_NAMES = {
    "reward",
    "reward_std",
    "rewards/countdown/mean",
    "frac_reward_zero_std",
    "kl",
    "clip_ratio/region_mean",
    "completions/mean_length",
    "learning_rate",
}


def test_trl_names_by_hand() -> None:
    metrics = {
        "reward/mean": 0.5,
        "reward/std": 0.4,
        "reward/group_std_mean": 0.3,
        "reward/zero_std_fraction": 0.25,
        "countdown/mean": 0.5,
        "countdown/std": 0.4,
        "countdown/accuracy/mean": 0.375,
        "advantages/mean": 0.0,
        "loss/kl": 0.02,
        "loss/clip_fraction": 0.1,
        "loss/completion_length": 6.0,
        "loss/truncated_fraction": 0.125,
        "loss/total": 0.7,
        "lr": 3e-4,
        "grad_norm": 1.5,
        "eval/reward": 0.6,
    }
    named = trl_names(metrics, token_run=True, group_size=4)
    # reward_std: TRL's sample std per group; groups of 4: 0.3 * sqrt(4 / 3) = 0.34641016.
    assert named["reward_std"] == pytest.approx(0.34641016)
    assert named == {
        "reward": 0.5,
        "reward/std": 0.4,
        "reward_std": named["reward_std"],
        "frac_reward_zero_std": 0.25,
        "rewards/countdown/mean": 0.5,
        "rewards/countdown/std": 0.4,
        "rewards/countdown/accuracy/mean": 0.375,
        "advantages/mean": 0.0,
        "kl": 0.02,
        "clip_ratio/region_mean": 0.1,
        "completions/mean_length": 6.0,
        "completions/clipped_ratio": 0.125,
        "loss": 0.7,
        "learning_rate": 3e-4,
        "grad_norm": 1.5,
        "eval/reward": 0.6,
    }
    # A flow objective's loss/kl is another quantity: it keeps its name.
    assert "loss/kl" in trl_names({"loss/kl": 0.1}, token_run=False, group_size=4)


def test_report_to_names_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"logging\.report_to\.1: unknown name 'wandbb'"):
        check_report_to(["tensorboard", "wandbb"])
    config = get_recipe("digits_flow_grpo").apply_overrides(["logging.report_to=trakio"])
    with pytest.raises(ConfigError, match=r"Did you mean 'trackio'"):
        config.validate()


def test_a_missing_tracker_names_its_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"logging\.report_to\.0: wandb is not installed: pip"):
        check_report_to(["wandb"])


def tensorboard_tags(run_dir: Path) -> tuple[set[str], set[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    return set(events.Tags()["scalars"]), set(events.Tags()["images"])


def tensorboard_images(run_dir: Path, tag: str) -> list[tuple[int, bytes]]:
    """(step, encoded picture) of every image TensorBoard holds under ``tag``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    return [(e.step, e.encoded_image_string) for e in events.Images(tag)]


def trackio_steps(database: Path, run: str, key: str) -> list[int]:
    """The steps of a Trackio run's rows that hold ``key``."""
    connection = sqlite3.connect(database)
    rows = connection.execute(
        "SELECT step, metrics FROM metrics WHERE run_name = ? ORDER BY step", [run]
    ).fetchall()
    connection.close()
    return [step for step, blob in rows if key in json.loads(blob)]


@pytest.mark.slow  # the held-out evaluation scores 200 Countdown problems twice
def test_token_run_logs_trl_names_and_keeps_metrics_jsonl(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = get_recipe("llm_countdown_grpo").apply_overrides(
        [*TINY, "eval.samples_per_prompt=1", "logging.report_to=tensorboard"]
    )
    Trainer(config, run_dir=tmp_path / "run").train()
    scalars, _ = tensorboard_tags(tmp_path / "run")
    assert scalars >= TRL_TOKEN_NAMES, TRL_TOKEN_NAMES - scalars
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert "reward/mean" in rows[1] and "reward" not in rows[1]  # genrl's names stay there


@pytest.mark.slow  # two tracker libraries to import and a short run: about 15 s
def test_each_tracker_writes_metrics_and_images_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    pytest.importorskip("wandb")
    if importlib.util.find_spec("trackio") is None:  # importing it now would fix its directory
        pytest.skip("trackio is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("TRACKIO_DIR", raising=False)  # restored after the test
    fresh = "trackio" not in sys.modules
    torch.set_num_threads(1)
    run_dir = tmp_path / "run"
    config = get_recipe("digits_flow_grpo").apply_overrides(
        [
            *TINY,
            "train.iterations=3",
            "eval.every=1",  # evaluations at 0 (before), 1, 2 and 3 (after)
            "logging.report_to=tensorboard,wandb,trackio",
            "logging.project=genrl-test",
        ]
    )
    Trainer(config, run_dir=run_dir).train()

    scalars, images = tensorboard_tags(run_dir)
    assert {"reward", "reward_std", "frac_reward_zero_std", "learning_rate"} <= scalars
    assert {"samples/samples_before", "samples/samples_after", "samples/eval"} <= images
    # Every evaluation's grid, at its iteration: the very bytes of samples/iter_*.png.
    events = tensorboard_images(run_dir, "samples/eval")
    assert [step for step, _ in events] == [0, 1, 2, 3]
    middle = (run_dir / "samples/iter_000002.png").read_bytes()
    assert events[2][1] == middle and events[1][1] != middle

    (wandb_run,) = (run_dir / "wandb").glob("offline-run-*")
    record = next(wandb_run.glob("run-*.wandb")).read_bytes()
    for name in (b"reward", b"reward_std", b"rewards/digit_classifier/mean", b"learning_rate"):
        assert name in record
    assert b"samples/samples_after" in record and b"image-file" in record
    assert b"samples/eval" in record
    # wandb copies each logged picture: the four grids of samples/iter_*.png, byte for byte.
    media = (wandb_run / "files/media/images/samples").glob("eval_*.png")
    grids = sorted((run_dir / "samples").glob("iter_*.png"))
    assert len(grids) == 4
    assert sorted(p.read_bytes() for p in media) == sorted(p.read_bytes() for p in grids)

    from trackio import utils

    directory = Path(utils.TRACKIO_DIR)
    if fresh:  # the default: next to the run's other files
        assert directory == run_dir / "trackio"
    database = sqlite3.connect(directory / "genrl-test.db")
    logged = [
        json.loads(blob)
        for (blob,) in database.execute("SELECT metrics FROM metrics WHERE run_name = ?", ["run"])
    ]
    database.close()
    keys = {key for row in logged for key in row}
    assert {"reward", "reward_std", "rewards/digit_classifier/mean", "learning_rate"} <= keys
    pictures = [row["samples/samples_after"] for row in logged if "samples/samples_after" in row]
    assert pictures and pictures[0]["_type"] == "trackio.image"
    assert (directory / "media" / pictures[0]["file_path"]).is_file()
    steps = trackio_steps(directory / "genrl-test.db", "run", "samples/eval")
    assert steps == [0, 1, 2, 3]
    assert all(math.isfinite(row["reward"]) for row in logged if "reward" in row)


def test_overwrite_clears_the_trackers_files(tmp_path: Path) -> None:
    from genrl.checkpoints.run_dir import clear_run

    for folder in ("wandb", "trackio"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "f").write_text("old run")
    (tmp_path / "notes.txt").write_text("mine")
    assert set(clear_run(tmp_path)) >= {"wandb", "trackio"}
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.slow  # imports both tracker libraries
def test_video_grids_reach_the_trackers_as_videos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from PIL import Image

    pytest.importorskip("wandb")
    if importlib.util.find_spec("trackio") is None:
        pytest.skip("trackio is not installed")
    from genrl.reporting.trackers import TrackioTracker, WandbTracker

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("TRACKIO_DIR", raising=False)
    gif = tmp_path / "samples_after.gif"
    frames = [Image.new("RGB", (8, 8), (40 * i, 0, 0)) for i in range(3)]
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=100, loop=0)
    run_dir = tmp_path / "videorun"
    run_dir.mkdir()
    trackers = [WandbTracker(run_dir, "genrl-test", {}), TrackioTracker(run_dir, "genrl-test", {})]
    for tracker in trackers:
        tracker.image("samples/samples_after", gif, 3)
        tracker.close()
    assert list((run_dir / "wandb").glob("offline-run-*/files/media/videos/**/*.gif"))
    database = sqlite3.connect(trackers[1].directory / "genrl-test.db")
    (blob,) = database.execute(
        "SELECT metrics FROM metrics WHERE run_name = ?", ["videorun"]
    ).fetchone()
    database.close()
    video = json.loads(blob)["samples/samples_after"]
    assert video["_type"] == "trackio.video"
    assert (trackers[1].directory / "media" / video["file_path"]).suffix == ".gif"
