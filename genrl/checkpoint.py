"""Exact, atomic checkpoints: safetensors for weights, ``weights_only`` torch files for the rest.

Layout of ``<run>/checkpoints/iter_000010/``: ``trainable.safetensors`` (trainable weights),
``ema.safetensors`` (if EMA), ``optimizer.pt`` (optimizer state), ``state.pt`` (counters,
algorithm and reward state, RNG states), ``state.json`` (the counters, human-readable).
A checkpoint is written into a temporary directory and renamed into place, so a crash leaves
either the old or the new checkpoint, never half of one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

PREFIX = "iter_"


class CheckpointError(FileNotFoundError):
    """A checkpoint is missing or incomplete; the message says where we looked."""


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    return run_dir / "checkpoints" / f"{PREFIX}{iteration:06d}"


def save_checkpoint(
    run_dir: Path,
    iteration: int,
    *,
    trainable: dict[str, torch.Tensor],
    optimizer: dict[str, Any],
    state: dict[str, Any],
    ema: dict[str, torch.Tensor] | None = None,
    keep: int = 2,
) -> Path:
    final = checkpoint_dir(run_dir, iteration)
    tmp = final.with_name(f".tmp-{final.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in trainable.items()}, tmp / "trainable.safetensors")
    if ema is not None:
        save_file({k: v.contiguous() for k, v in ema.items()}, tmp / "ema.safetensors")
    torch.save(optimizer, tmp / "optimizer.pt")
    full_state = {
        **state,
        "iteration": iteration,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }
    torch.save(full_state, tmp / "state.pt")
    summary = {k: v for k, v in state.items() if isinstance(v, int | float | str)}
    (tmp / "state.json").write_text(json.dumps({"iteration": iteration, **summary}, indent=2))
    if final.exists():
        # Re-saving an iteration: move the old copy aside first so that a crash at any point
        # leaves one complete checkpoint.
        old = final.with_name(f".old-{final.name}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    _prune(run_dir, keep)
    return final


def _prune(run_dir: Path, keep: int) -> None:
    found = list_checkpoints(run_dir)
    for old in found[: max(0, len(found) - keep)]:
        shutil.rmtree(old)


def set_aside_newer(run_dir: Path, iteration: int) -> list[Path]:
    """Resuming from an older checkpoint starts a new branch: move the run's later checkpoints
    to ``checkpoints/abandoned/`` so that pruning and a later ``--resume`` never mix branches."""
    moved = []
    for path in list_checkpoints(run_dir):
        if int(path.name.removeprefix(PREFIX)) > iteration:
            target = run_dir / "checkpoints" / "abandoned" / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                shutil.rmtree(target)
            os.replace(path, target)
            moved.append(target)
    return moved


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or the latest checkpoint of a run directory."""
    path = Path(path)
    if (path / "state.pt").is_file():
        return path
    if not path.exists():
        raise CheckpointError(f"cannot resume: {path} does not exist")
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(
            f"cannot resume: {path} holds no checkpoint (expected {path}/checkpoints/{PREFIX}*/ "
            "with state.pt, or a checkpoint directory itself)"
        )
    return found[-1]


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Everything ``save_checkpoint`` wrote, as tensors and plain objects."""
    for name in ("trainable.safetensors", "optimizer.pt", "state.pt"):
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is missing")
    out: dict[str, Any] = {
        "trainable": load_file(path / "trainable.safetensors"),
        "optimizer": torch.load(path / "optimizer.pt", weights_only=True),
        "state": torch.load(path / "state.pt", weights_only=True),
    }
    if (path / "ema.safetensors").is_file():
        out["ema"] = load_file(path / "ema.safetensors")
    return out


def restore_rng(state: dict[str, Any]) -> None:
    rng = state.get("rng")
    if rng:
        torch.set_rng_state(rng["torch"])
        random.setstate(_as_tuple(rng["python"]))


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value
