"""What the cached benchmarks share: one training run with its console output in a log file, and
a result written so that a killed benchmark leaves no half-written cache entry."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any


def train_logged(config: Any, out: Path, key: str) -> tuple[dict[str, Any], Path, float]:
    """Train ``config`` in ``<out>/runs/<key>`` through the ``Trainer`` the CLI uses, its console
    output in ``<out>/logs/<key>.log``; returns the summary, the run directory and the seconds."""
    from genrl import Trainer

    run_dir = out / "runs" / key
    (out / "logs").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with (
        open(out / "logs" / f"{key}.log", "w", encoding="utf-8") as log,
        contextlib.redirect_stdout(log),
    ):
        summary = Trainer(config, run_dir=run_dir, overwrite=True).train()
    return summary, run_dir, time.perf_counter() - started


def write_result(path: Path, result: dict[str, Any], indent: int | None = None) -> None:
    """``result`` as JSON at ``path``, through a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(result, indent=indent) + "\n")
    os.replace(partial, path)


__all__ = ["train_logged", "write_result"]
