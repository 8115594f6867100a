"""Exact resume, the check the stateful components share: a run trained straight and the same
run stopped after some iterations and resumed from its checkpoint must log the same metrics
(timings aside) and end with the same weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from genrl.loop.trainer import Trainer
from genrl.reporting.metrics import read_metrics
from genrl.run.config import TrainConfig


def trained_rows(run: Path, ignore: tuple[str, ...] = ("time/",)) -> list[dict]:
    """The iteration rows of ``run``'s ``metrics.jsonl`` without the keys starting ``ignore``."""
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "train_units" in r]
    return [{k: v for k, v in r.items() if not k.startswith(ignore)} for r in rows]


def straight_and_resumed(
    make_config: Callable[[], TrainConfig],
    root: Path,
    stop_after: int,
    ignore: tuple[str, ...] = ("time/",),
) -> tuple[Trainer, Trainer]:
    """Train ``make_config()`` straight in ``root/a`` and, in ``root/b``, for ``stop_after``
    iterations and then resumed; assert the two runs match. Returns both trainers."""
    straight = Trainer(make_config(), run_dir=root / "a")
    straight.train()
    Trainer(make_config(), run_dir=root / "b").train(stop_after=stop_after)
    resumed = Trainer(make_config(), run_dir=root / "b", resume_from=root / "b")
    resumed.train()
    assert trained_rows(root / "a", ignore) == trained_rows(root / "b", ignore)
    mine = resumed.policy.trainable_state_dict()
    for name, value in straight.policy.trainable_state_dict().items():
        assert torch.equal(value, mine[name]), name
    return straight, resumed
