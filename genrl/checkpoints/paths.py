"""Where a run's checkpoints live (``<run>/checkpoints/iter_000010/``) and the errors about
them, without torch: the command line finds the run directory of ``--resume`` or
``--checkpoint`` and reads its ``config.json`` before it imports torch, so a config error in a
resumed run answers at once. ``checkpoint.py`` writes, verifies and loads the files.
"""

from __future__ import annotations

from pathlib import Path

PREFIX = "iter_"
MANIFEST = "manifest.json"


class CheckpointError(FileNotFoundError):
    """A checkpoint is missing or incomplete; the message says where we looked."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is missing, differs from what was saved, or cannot be read; the message
    names the checkpoint and the file."""


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    return run_dir / "checkpoints" / f"{PREFIX}{iteration:06d}"


def staging_dir(run_dir: Path, iteration: int) -> Path:
    """The temporary directory a checkpoint is written into before it is renamed into place."""
    final = checkpoint_dir(run_dir, iteration)
    return final.with_name(f".tmp-{final.name}")


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def is_checkpoint(path: Path) -> bool:
    """A checkpoint directory (as opposed to a run directory), even with files missing."""
    if (path / MANIFEST).is_file() or (path / "state.pt").is_file():
        return True
    return path.is_dir() and path.name.startswith(PREFIX) and path.parent.name == "checkpoints"


def run_dir_of(path: str | Path) -> Path:
    """The run directory of a checkpoint directory, or ``path`` itself for a run directory that
    holds checkpoints (nothing is verified here; see ``resolve_checkpoint``)."""
    path = Path(path)
    if is_checkpoint(path):
        return path.parent.parent
    checkpoints_of(path)
    return path


def checkpoints_of(path: Path) -> list[Path]:
    # Worded for every command that reads a checkpoint (train --resume, eval/sample/export
    # --checkpoint), not for resuming only.
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(
            f"{path} holds no checkpoint (expected {path}/checkpoints/{PREFIX}*/ with state.pt, "
            "or a checkpoint directory itself)"
        )
    return found
