"""Experiment trackers (``logging.report_to``): TensorBoard, Weights & Biases and Trackio.

``metrics.jsonl`` keeps genrl's own metric names (the golden curves and the plots read them);
the trackers get TRL's names wherever the quantity is the same (``trl_names``), so that a
dashboard built for TRL's ``GRPOTrainer`` reads a genrl run unchanged. Each tracker's library
is optional and imported only when a run reports to it; a missing one is named with the pip
command that installs it, when the config is validated (before any model loads).
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import Any, Protocol

from genrl.config.errors import ConfigError, unknown_message

# report_to name -> (the module it imports, the pip command that installs it).
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "wandb": ("wandb", "pip install wandb"),
    "trackio": ("trackio", "pip install trackio"),
}

# genrl metric -> TRL GRPOTrainer metric, for the quantities both compute the same way
# (trl/trainer/grpo_trainer.py; the table in README.md, "Experiment trackers").
RENAMED = {
    "reward/mean": "reward",
    "reward/zero_std_fraction": "frac_reward_zero_std",
    "loss/clip_fraction": "clip_ratio/region_mean",
    "loss/completion_length": "completions/mean_length",
    "loss/truncated_fraction": "completions/clipped_ratio",
    "loss/total": "loss",
    "lr": "learning_rate",
}
# Sections of genrl's own metrics; any other ``<score>/mean`` or ``<score>/std`` is a reward's.
OWN_SECTIONS = {"reward", "advantages", "loss", "time", "eval"}


def trl_names(metrics: dict[str, float], token_run: bool, group_size: int) -> dict[str, float]:
    """``metrics`` under TRL's names where the quantity is the same; other keys unchanged.

    ``reward_std`` is TRL's mean over groups of each group's sample standard deviation (Bessel's
    correction), so genrl's ``reward/group_std_mean`` (population std per group, all groups of
    ``group_size``) is scaled by ``sqrt(G / (G - 1))``. ``kl`` is renamed only in token runs,
    where ``loss/kl`` is TRL's mean per-token k3 estimate; a flow or regression objective's
    ``loss/kl`` is another quantity and keeps its name.
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        head, _, tail = key.rpartition("/")
        if key in RENAMED:
            out[RENAMED[key]] = value
        elif key == "reward/group_std_mean":
            scale = math.sqrt(group_size / (group_size - 1)) if group_size > 1 else 1.0
            out["reward_std"] = value * scale
        elif key == "loss/kl" and token_run:
            out["kl"] = value
        elif tail in ("mean", "std") and head and head.split("/")[0] not in OWN_SECTIONS:
            out[f"rewards/{key}"] = value
        else:
            out[key] = value
    return out


class Tracker(Protocol):
    """What ``MetricsWriter`` forwards to each tracker (main process only)."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def image(self, tag: str, path: Path, step: int) -> None: ...

    def close(self) -> None: ...


def check_report_to(names: list[str]) -> None:
    """Raise ``ConfigError`` for an unknown tracker name or one whose library is missing."""
    for i, name in enumerate(names):
        if name not in TRACKERS:
            raise ConfigError(
                unknown_message(name, list(TRACKERS), f"logging.report_to.{i}", value=True)
            )
        module, command = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"logging.report_to.{i}: {name} is not installed: {command} "
                '(or pip install "genrl[trackers]")'
            )


class WandbTracker:
    """A Weights & Biases run whose files go under ``<run>/wandb/``. ``WANDB_MODE=offline``
    writes them without an account or network (``wandb sync`` uploads them later)."""

    def __init__(self, run_dir: Path, project: str, config: dict[str, Any]) -> None:
        import wandb

        self._wandb = wandb
        # No system-stats sampler or console capture: the run's own metrics are what matters,
        # and a background sampler costs a thread on a 2-core machine.
        settings = wandb.Settings(x_disable_stats=True, console="off", save_code=False)
        self.run = wandb.init(
            project=project, name=run_dir.name, dir=str(run_dir), config=config, settings=settings
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def image(self, tag: str, path: Path, step: int) -> None:
        """A PNG as an image; an animated GIF (a video policy's grid) as a video, which wandb
        plays from the file itself (no encoding)."""
        kind = self._wandb.Video if path.suffix == ".gif" else self._wandb.Image
        self.run.log({tag: kind(str(path))}, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    """A Trackio run: a local SQLite database (``<TRACKIO_DIR>/<project>.db``) with the images
    under ``<TRACKIO_DIR>/media/``. ``TRACKIO_DIR`` defaults to ``<run>/trackio`` here (Trackio's
    own default is the Hugging Face cache); Trackio reads it once, when first imported, so a
    process that imported it before keeps its directory (``self.directory`` says which)."""

    def __init__(self, run_dir: Path, project: str, config: dict[str, Any]) -> None:
        os.environ.setdefault("TRACKIO_DIR", str(run_dir / "trackio"))
        import trackio
        from trackio import utils

        self._trackio = trackio
        self.directory = Path(utils.TRACKIO_DIR)
        self.project = project
        self.run = trackio.init(
            project=project,
            name=run_dir.name,
            config=config,
            resume="allow",
            embed=False,
            auto_log_cpu=False,
            auto_log_gpu=False,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def image(self, tag: str, path: Path, step: int) -> None:
        """A PNG as an image; an animated GIF as a video (Trackio copies the file)."""
        if path.suffix == ".gif":
            self.run.log({tag: self._trackio.Video(str(path))}, step=step)
            return
        from PIL import Image

        with Image.open(path) as picture:
            frame = picture.convert("RGB")
        self.run.log({tag: self._trackio.Image(frame)}, step=step)

    def close(self) -> None:
        self.run.finish()


def build_trackers(names: list[str], run_dir: Path, project: str, config: dict) -> list[Tracker]:
    """The trackers of ``names`` other than TensorBoard (``MetricsWriter`` writes that one)."""
    check_report_to(names)
    classes: dict[str, Any] = {"wandb": WandbTracker, "trackio": TrackioTracker}
    return [classes[name](run_dir, project, config) for name in names if name in classes]


__all__ = [
    "RENAMED",
    "TRACKERS",
    "Tracker",
    "TrackioTracker",
    "WandbTracker",
    "build_trackers",
    "check_report_to",
    "trl_names",
]
