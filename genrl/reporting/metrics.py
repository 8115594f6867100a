"""Metrics: one JSON line per iteration, the experiment trackers (TensorBoard, wandb, Trackio:
``genrl/reporting/trackers.py``), and a short console summary."""

from __future__ import annotations

import contextlib
import json
import math
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from genrl.data.fileio import naming_full_disk
from genrl.reporting.trackers import Tracker, build_trackers, trl_names


class MetricsError(ValueError):
    """``metrics.jsonl`` is corrupt: a line other than a torn last one is not JSON."""


class MetricsWriter:
    """Appends ``{"iteration": i, ...}`` lines to ``metrics.jsonl`` and mirrors them to the
    trackers, under TRL's names where the quantity is the same (``genrl.reporting.trackers.trl_names``).

    Args:
        run_dir: the run directory.
        tensorboard: also write event files under ``run_dir/tensorboard``.
        resume_iteration: on resume from the checkpoint of this iteration, drop the lines logged
            after that checkpoint was written (see ``logged_before_checkpoint``) so that no
            iteration, and no final evaluation, appears twice.
        trackers: further trackers (wandb, Trackio), given every row and picture.
        token_run: the run trains a token policy (``kl`` is then TRL's quantity).
        group_size: samples per group (TRL's ``reward_std`` is a sample std per group).
    """

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        resume_iteration: int | None = None,
        trackers: list[Tracker] | None = None,
        token_run: bool = False,
        group_size: int = 2,
    ) -> None:
        self.trackers = list(trackers or [])
        self.token_run, self.group_size = token_run, group_size
        self.path = run_dir / "metrics.jsonl"
        if resume_iteration is not None and self.path.exists():
            rows = read_metrics(self.path)
            kept = [row for row in rows if logged_before_checkpoint(row, resume_iteration)]
            with naming_full_disk(self.path):
                self.path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # Steps up to the checkpoint's iteration were logged before it was written: keep them.
            purge = None if resume_iteration is None else resume_iteration + 1
            self._tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)

    def write(self, iteration: int, metrics: dict[str, float]) -> None:
        row = {"iteration": iteration, **{k: _finite(v) for k, v in metrics.items()}}
        with naming_full_disk(self.path), self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        numbers = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and math.isfinite(v)
        }
        named = trl_names(numbers, self.token_run, self.group_size)
        if self._tb is not None:
            for key, value in named.items():
                self._tb.add_scalar(key, value, iteration)
        for tracker in self.trackers:
            tracker.log(named, iteration)

    def add_picture(self, tag: str, path: Path, step: int) -> None:
        """Show a PNG or (animated) GIF file in TensorBoard's image tab. The file's own bytes
        go into an image summary, which TensorBoard plays when they are a GIF: torch's
        ``add_video`` would re-encode the frames and needs moviepy, which genrl does not use.
        The other trackers get the picture too (a GIF as a video)."""
        for tracker in self.trackers:
            tracker.image(tag, path, step)
        if self._tb is None:
            return
        from PIL import Image
        from torch.utils.tensorboard.summary import Summary

        with Image.open(path) as picture:
            width, height = picture.size
        image = Summary.Image(
            height=height, width=width, colorspace=3, encoded_image_string=path.read_bytes()
        )
        summary = Summary(value=[Summary.Value(tag=tag, image=image)])
        self._tb._get_file_writer().add_summary(summary, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        for tracker in self.trackers:
            tracker.close()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; None marks a missing value
    return value


def logged_before_checkpoint(row: dict[str, Any], iteration: int) -> bool:
    """Whether ``row`` was logged before the checkpoint of ``iteration`` was written: the rows of
    earlier iterations and that iteration's own row, but not the final held-out evaluation (an
    ``eval/``-only row at the last iteration, logged after the final checkpoint). The
    evaluation before training (an ``eval/``-only row at 0) precedes every checkpoint."""
    if row["iteration"] != iteration:
        return row["iteration"] < iteration
    return iteration == 0 or any(k != "iteration" and not k.startswith("eval/") for k in row)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl``. A torn last line (no newline and not JSON: a write cut
    short by a full disk or a crash) is left out: it was being logged after the run's last
    checkpoint. A line that is not JSON anywhere else raises ``MetricsError``."""
    if not path.exists():
        return []
    *lines, tail = path.read_text(encoding="utf-8").split("\n")
    rows = [_parse(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if tail.strip():
        with contextlib.suppress(MetricsError):  # torn: dropped
            rows.append(_parse(path, len(lines) + 1, tail))
    return rows


def _parse(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise MetricsError(
            f"{path}: line {number} is not valid JSON ({err.msg} at column {err.colno}); "
            "the file is corrupt (only a torn last line is skipped)"
        ) from None


class MeanAccumulator:
    """Averages metric dicts over minibatches. Values may be detached 0-dim tensors (kept on
    their device and summed there) or floats; ``means`` reads every tensor back in one
    transfer per device, so accumulating costs no synchronisation per minibatch."""

    def __init__(self) -> None:
        self.sums: dict[str, Any] = {}
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, metrics: Mapping[str, Any]) -> None:
        for k, v in metrics.items():
            value = v.detach().float() if isinstance(v, torch.Tensor) else float(v)
            self.sums[k] = value if k not in self.sums else self.sums[k] + value
            self.counts[k] += 1

    def means(self, prefix: str = "") -> dict[str, float]:
        return {prefix + k: v / self.counts[k] for k, v in to_floats(self.sums).items()}


def to_floats(values: Mapping[str, Any]) -> dict[str, float]:
    """Floats of a dict of 0-dim tensors and numbers, one device transfer per device."""
    out = {k: float(v) for k, v in values.items() if not isinstance(v, torch.Tensor)}
    tensors = {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}
    by_device: dict[torch.device, list[str]] = defaultdict(list)
    for k, v in tensors.items():
        by_device[v.device].append(k)
    for keys in by_device.values():
        read = torch.stack([tensors[k].reshape(()).float() for k in keys]).tolist()
        out.update(zip(keys, read, strict=True))
    return {k: out[k] for k in values}


def console_line(iteration: int, total: int, metrics: dict[str, float]) -> str:
    """``it 10/60  reward 0.612±0.210  kl 1.2e-03  clip 0.02  3.1 s/it``."""
    parts = [f"it {iteration}/{total}"]
    if "reward/mean" in metrics:
        parts.append(f"reward {metrics['reward/mean']:.3f}±{metrics.get('reward/std', 0.0):.3f}")
    if "eval/reward" in metrics:
        parts.append(f"eval {metrics['eval/reward']:.3f}")
    kl_key = "loss/kl" if "loss/kl" in metrics else "loss/kl_loss"
    for key, label in ((kl_key, "kl"), ("loss/clip_fraction", "clip"), ("grad_norm", "|g|")):
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.2e}")
    if "time/iteration_s" in metrics:
        parts.append(f"{metrics['time/iteration_s']:.2f} s/it")
    return "  ".join(parts)


def open_writer(config: Any, run_dir: Path, resume_iteration: int | None = None) -> MetricsWriter:
    """The run's ``MetricsWriter`` with the trackers ``config.logging.report_to`` names."""

    log = config.logging
    trackers = build_trackers(log.report_to, run_dir, log.project, config.to_dict())
    return MetricsWriter(
        run_dir,
        log.tensorboard and "tensorboard" in log.report_to,
        resume_iteration=resume_iteration,
        trackers=trackers,
        token_run=config.generation is not None,
        group_size=config.train.group_size,
    )
