"""One run per run directory: a fresh run refuses a directory that holds another run's files,
unless told to replace them; ``--overwrite`` deletes only what a run writes.

Two runs in one directory used to merge: the old run's later checkpoints sorted after the new
run's (which were then pruned as they were written), ``metrics.jsonl`` interleaved both runs and
``genrl eval --checkpoint DIR`` scored one run while ``summary.json`` described the other.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from genrl.run.config import TrainConfig

# What a run writes into its directory (genrl/reporting/report.py, metrics.py, checkpoint.py, trainer.py).
RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "summary.json",
    "reward_curve.png",
    "score_curves.png",
    "samples_before.png",
    "samples_after.png",
    "samples_before_after.png",
    "samples_before.gif",
    "samples_after.gif",
    "samples_before_after.gif",
    "samples_before.md",
    "samples_after.md",
    "per_prompt.txt",
    "report.html",
)
RUN_FOLDERS = ("checkpoints", "tensorboard", "export", "samples", "wandb", "trackio")
# Any of these marks a directory as holding a run: config.json is the first file a run writes.
MARKERS = ("config.json", "metrics.jsonl", "summary.json", "checkpoints")


class RunDirectoryError(ValueError):
    """A fresh run was pointed at a directory that holds another run."""


def run_markers(run_dir: Path) -> list[str]:
    """The markers of a run found in ``run_dir`` (folders with a trailing ``/``)."""
    if not run_dir.is_dir():  # absent, or os.devnull for commands that write no run
        return []
    found = []
    for name in MARKERS:
        path = run_dir / name
        if path.is_dir():
            found.append(f"{name}/")
        elif path.exists():
            found.append(name)
    return found


def refuse_existing_run(run_dir: Path) -> None:
    """Raise ``RunDirectoryError`` if ``run_dir`` holds a run; say what is there and what to do."""
    found = run_markers(run_dir)
    if found:
        raise RunDirectoryError(
            f"{run_dir} already holds a run ({', '.join(found)}): continue it with --resume "
            f"{run_dir} (Python: resume_from=), or start over with --overwrite (overwrite=True), "
            "which deletes that run's files and keeps any others"
        )


def clear_run(run_dir: Path) -> list[str]:
    """Delete the files and folders a run writes from ``run_dir``; leave everything else.
    Returns the names deleted."""
    removed = []
    for name in (*RUN_FILES, *RUN_FOLDERS):
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def resolve_run_dir(config: TrainConfig, run_dir: str | Path | None = None) -> Path:
    """``run_dir``, else ``config.output_dir``, else a new ``runs/<recipe>-<time>``."""
    return Path(run_dir or config.output_dir or _default_run_dir(config.recipe))


def _default_run_dir(recipe: str) -> Path:
    base = Path("runs") / f"{recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    # Two runs started in the same second get directories of their own.
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path
