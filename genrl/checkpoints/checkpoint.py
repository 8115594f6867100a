"""Exact, atomic, verified checkpoints: safetensors for weights, ``weights_only`` torch files for
the rest.

Layout of ``<run>/checkpoints/iter_000010/``: ``trainable.safetensors`` (trainable weights),
``ema.safetensors`` (if EMA), ``optimizer.pt`` (optimizer state), ``state.pt`` (counters,
algorithm and reward state, RNG states), ``state.json`` (the counters, human-readable) and
``manifest.json`` (size and SHA-256 of every other file, written last). A sharded run (FSDP2)
has, instead of the first three, torch distributed checkpointing's files: ``__<rank>_0.distcp``
written by every process for its shard of the weights and optimizer state, and ``.metadata``
(the manifest says ``"sharded": true``; ``genrl/distributed/sharding.py`` writes and reads them).

Writing: every file goes into a temporary directory and is fsynced; the manifest follows, then
the directory is fsynced and renamed into place (and its parent fsynced), so a crash or a power
loss leaves either the old or the new checkpoint, never half of one. A full disk raises
``DiskFullError`` naming the file, and the temporary directory is removed.

Reading: ``resolve_checkpoint`` checks every file against the manifest before anything is
loaded. A named checkpoint directory that fails the check is an error naming the file; resuming
a run directory falls back to its newest intact checkpoint, with a warning naming each corrupt
one it skips. A checkpoint without ``manifest.json`` is corrupt like any other (its files could
not be checked, so a flipped byte would load): every checkpoint this version writes has one,
and the checkpoints genrl wrote before manifests existed (commit 2d5cb88 added them) hold the
state layout from before rollouts and objectives were split (commit b453c62, later), which
``load_checkpoint`` refuses anyway, so no checkpoint this version could load lacks one.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from genrl.checkpoints.paths import MANIFEST, PREFIX, checkpoints_of, is_checkpoint, staging_dir
from genrl.checkpoints.paths import CheckpointError as CheckpointError
from genrl.checkpoints.paths import CorruptCheckpointError as CorruptCheckpointError
from genrl.checkpoints.paths import checkpoint_dir as checkpoint_dir
from genrl.checkpoints.paths import list_checkpoints as list_checkpoints
from genrl.checkpoints.paths import run_dir_of as run_dir_of
from genrl.data.fileio import fsync_directory, naming_full_disk

FORMAT = "genrl-checkpoint/1"
REQUIRED = ("trainable.safetensors", "optimizer.pt", "state.pt")
# A sharded checkpoint (FSDP2): torch distributed checkpointing's files, one per process, in
# place of the trainable weights and optimizer state (genrl/distributed/sharding.py).
REQUIRED_SHARDED = (".metadata", "state.pt")
# What state.pt must hold to be one of ours (Trainer.state() plus the counters added at save).
STATE_KEYS = ("iteration", "optimizer_steps", "rollout", "objective", "reward")


def begin_staging(run_dir: Path, iteration: int) -> Path:
    """Create an empty ``staging_dir`` (removing a leftover one); returns it."""
    tmp = staging_dir(run_dir, iteration)
    if tmp.exists():
        shutil.rmtree(tmp)
    with naming_full_disk(tmp):
        tmp.mkdir(parents=True)
    return tmp


def save_checkpoint(
    run_dir: Path,
    iteration: int,
    *,
    trainable: dict[str, torch.Tensor] | None,
    optimizer: dict[str, Any] | None,
    state: dict[str, Any],
    ema: dict[str, torch.Tensor] | None = None,
    keep: int = 2,
    staged: bool = False,
) -> Path:
    """Write the checkpoint of ``iteration`` atomically (module docstring).

    ``staged``: other writers (every process of a sharded run, ``genrl/distributed/sharding.py``) have
    already put their files into ``begin_staging``'s directory; they are checksummed into the
    manifest with the rest, and ``trainable`` and ``optimizer`` are None (the shards hold
    them)."""
    final = checkpoint_dir(run_dir, iteration)
    tmp = staging_dir(run_dir, iteration) if staged else begin_staging(run_dir, iteration)
    if staged != (trainable is None and optimizer is None):
        raise ValueError("a staged (sharded) checkpoint has no trainable or optimizer dicts")
    full_state = {
        **state,
        "iteration": iteration,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }
    summary = {k: v for k, v in state.items() if isinstance(v, int | float | str)}
    writers: dict[str, Callable[[_HashingWriter], object]] = {}
    if trainable is not None and optimizer is not None:
        writers["trainable.safetensors"] = lambda f: f.write(_safetensors(trainable))
        # torch.save only calls write(); the writer hashes what passes through.
        writers["optimizer.pt"] = lambda f: torch.save(optimizer, cast(IO[bytes], f))
    writers |= {
        "state.pt": lambda f: torch.save(full_state, cast(IO[bytes], f)),
        "state.json": lambda f: f.write(
            json.dumps({"iteration": iteration, **summary}, indent=2).encode()
        ),
    }
    if ema is not None:
        writers["ema.safetensors"] = lambda f: f.write(_safetensors(ema))
    try:
        files = {name: _write(tmp / name, write) for name, write in writers.items()}
        if staged:  # the shards the processes wrote (fsynced here, then checksummed)
            for file in sorted(tmp.iterdir()):
                if file.name not in files:
                    files[file.name] = _checksum(file)
        manifest = {"format": FORMAT, "files": files, "sharded": staged}
        # Last, so that a directory with a manifest holds every file the manifest lists.
        _write(tmp / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=2).encode()))
        fsync_directory(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # also gives a full disk its space back
        raise
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
    fsync_directory(final.parent)  # the rename itself survives a power loss
    fsync_directory(run_dir)  # and so does checkpoints/ when this save created it
    _prune(run_dir, keep)
    return final


def _safetensors(tensors: dict[str, torch.Tensor]) -> bytes:
    # Serialised in memory (transient copies of the weights: small for LoRA) and written by
    # Python, because the library's own file writer reports a full disk without the errno.
    return safetensors_bytes({k: v.contiguous() for k, v in tensors.items()})


class _HashingWriter:
    """The file object ``torch.save`` writes to: hashes what passes through and keeps the first
    ``OSError``, which torch re-raises as a ``RuntimeError`` without the errno."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            written = self.handle.write(data)
        except OSError as err:
            self.error = self.error or err
            raise
        self.digest.update(data)
        self.size += memoryview(data).nbytes
        return written

    def flush(self) -> None:
        self.handle.flush()


def _write(path: Path, fill: Callable[[_HashingWriter], object]) -> dict[str, Any]:
    """Write ``path`` through ``fill(file)`` and fsync it; returns its size and SHA-256."""
    with naming_full_disk(path), open(path, "wb") as handle:
        writer = _HashingWriter(handle)
        try:
            fill(writer)
        except Exception:
            if writer.error is not None:
                raise writer.error from None
            raise
        handle.flush()
        os.fsync(handle.fileno())
    return {"bytes": writer.size, "sha256": writer.digest.hexdigest()}


def _checksum(path: Path) -> dict[str, Any]:
    """Size and SHA-256 of a file another writer made, after an fsync."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
    return {"bytes": path.stat().st_size, "sha256": _sha256(path)}


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


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory whose files passed ``verify_checkpoint``: ``path`` itself when it
    is one (``CorruptCheckpointError`` when it fails), or the newest intact checkpoint of the run
    directory ``path``, with a warning naming each newer one that is corrupt."""
    path = Path(path)
    if is_checkpoint(path):
        verify_checkpoint(path)
        return path
    found = checkpoints_of(path)
    problems = []
    for candidate in reversed(found):
        try:
            verify_checkpoint(candidate)
        except CorruptCheckpointError as err:
            problems.append(str(err))
            _warn(f"{err}; skipping it")
            continue
        if problems:
            _warn(f"using {candidate}, the newest intact checkpoint of {path}")
        return candidate
    raise CorruptCheckpointError(f"no intact checkpoint in {path}: {'; '.join(problems)}")


def verify_checkpoint(path: Path) -> None:
    """Check every file of the checkpoint ``path`` against its manifest (size, then SHA-256);
    raise ``CorruptCheckpointError`` naming the first file that is missing or differs."""
    manifest = _read_manifest(path)
    files = manifest["files"]
    required = REQUIRED_SHARDED if manifest.get("sharded") else REQUIRED
    _require_files(path, [*required, *files])
    for name in required:
        if name not in files:
            raise CorruptCheckpointError(
                f"checkpoint {path} is corrupt: {MANIFEST} does not list {name}"
            )
    for name, entry in files.items():
        size = (path / name).stat().st_size
        if size != entry["bytes"]:
            raise CorruptCheckpointError(
                f"checkpoint {path} is corrupt: {name} has {size} bytes, but {entry['bytes']} "
                "were saved (truncated or overwritten)"
            )
        if _sha256(path / name) != entry["sha256"]:
            raise CorruptCheckpointError(
                f"checkpoint {path} is corrupt: {name} differs from the file that was saved "
                "(its SHA-256 does not match the manifest)"
            )


def _require_files(path: Path, names: list[str] | tuple[str, ...]) -> None:
    for name in names:
        if not (path / name).is_file():
            raise CorruptCheckpointError(f"checkpoint {path} is incomplete: {name} is missing")


def _read_manifest(path: Path) -> dict[str, Any]:
    """The checkpoint's manifest; ``CorruptCheckpointError`` when it is missing or unreadable
    (the module docstring says why a missing one is corruption, not an older format)."""
    file = path / MANIFEST
    if not file.is_file():
        raise CorruptCheckpointError(
            f"checkpoint {path} is corrupt: {MANIFEST} is missing, so its files cannot be "
            "checked (genrl writes one into every checkpoint)"
        )
    try:
        manifest = json.loads(file.read_bytes())
        files = manifest["files"]
        valid = manifest["format"] == FORMAT and all(
            isinstance(name, str)
            and "/" not in name
            and isinstance(entry["bytes"], int)
            and isinstance(entry["sha256"], str)
            for name, entry in files.items()
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        valid = False
    if not valid:
        raise CorruptCheckpointError(f"checkpoint {path} is corrupt: {MANIFEST} is unreadable")
    return manifest


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _warn(message: str) -> None:
    print(f"genrl: warning: {message}", file=sys.stderr, flush=True)


def load_checkpoint(path: Path, verified: bool = False) -> dict[str, Any]:
    """Everything ``save_checkpoint`` wrote, as tensors and plain objects.

    Args:
        path: a checkpoint directory.
        verified: the caller has just verified it (``resolve_checkpoint``); skip hashing again.
    """
    if not verified:
        verify_checkpoint(path)
    if is_sharded_checkpoint(path):  # the shards are read by genrl/distributed/sharding.py
        out: dict[str, Any] = {"state": _load(path, "state.pt"), "sharded": path}
    else:
        out = {
            "trainable": _load(path, "trainable.safetensors"),
            "optimizer": _load(path, "optimizer.pt"),
            "state": _load(path, "state.pt"),
        }
    if (path / "ema.safetensors").is_file():
        out["ema"] = _load(path, "ema.safetensors")
    state = out["state"]
    missing = [k for k in STATE_KEYS if k not in state] if isinstance(state, dict) else STATE_KEYS
    if missing and isinstance(state, dict) and "algorithm" in state:
        raise CorruptCheckpointError(
            f"checkpoint {path} was written before rollouts and objectives were split (its "
            "state has one 'algorithm' entry); resume it with the genrl version that wrote it"
        )
    if missing:
        raise CorruptCheckpointError(
            f"checkpoint {path}: state.pt is not a genrl checkpoint state (no {missing[0]!r})"
        )
    return out


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether the checkpoint ``path`` holds per-process shards (an FSDP2 run's)."""
    return bool(_read_manifest(path).get("sharded"))


def _load(path: Path, name: str) -> Any:
    """One file of the checkpoint; a file that cannot be parsed is named in the error."""
    file = path / name
    try:
        if name.endswith(".safetensors"):
            return load_file(file)
        return torch.load(file, weights_only=True)
    except pickle.UnpicklingError as err:
        raise CorruptCheckpointError(
            f"checkpoint {path}: {name} is not a genrl checkpoint file or was tampered with: it "
            "holds objects other than tensors and plain values, which genrl refuses to unpickle"
        ) from err
    except (SafetensorError, RuntimeError, EOFError, OSError) as err:
        kind = "safetensors" if name.endswith(".safetensors") else "torch"
        raise CorruptCheckpointError(
            f"checkpoint {path} is corrupt: {name} cannot be read as a {kind} file "
            f"({type(err).__name__}; truncated or damaged)"
        ) from err


def restore_rng(state: dict[str, Any]) -> None:
    rng = state.get("rng")
    if rng:
        torch.set_rng_state(rng["torch"])
        random.setstate(_as_tuple(rng["python"]))


def _as_tuple(value: Any) -> Any:
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value
