"""Durable writes and the errors a full disk or a wrong output path turn into.

The checkpoint writer and the rollout store make a write durable the same way: flush and
``fsync`` the file, rename it into place, then ``fsync`` the directory so that the rename itself
survives a power loss. A write that fails because the disk is full raises ``DiskFullError``
naming the file, so the command line can say so in one line.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

# A full disk and an exhausted quota look the same to the user: nothing more can be written.
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


class DiskFullError(OSError):
    """Writing ``filename`` failed because the disk (or the user's quota) is full."""

    def __init__(self, path: str | Path, reason: str = "No space left on device") -> None:
        super().__init__(errno.ENOSPC, reason, str(path))

    def __str__(self) -> str:
        return f"the disk is full: cannot write {self.filename} ({self.strerror})"


class OutputPathError(ValueError):
    """An output directory names an existing file (or lies below one)."""


@contextlib.contextmanager
def naming_full_disk(path: str | Path) -> Iterator[None]:
    """Turn an out-of-space ``OSError`` raised inside the block into ``DiskFullError(path)``:
    Python's own message often lacks the file name (a failing ``write`` or ``close`` has none)."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as err:
        if err.errno in _NO_SPACE:
            raise DiskFullError(path, err.strerror or "No space left on device") from err
        raise


def fsync_file(path: str | Path) -> None:
    """Flush ``path``'s data to the disk."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_directory(directory: str | Path) -> None:
    """Make the entries of ``directory`` (new files, renames) durable."""
    if os.name != "posix":  # directories cannot be opened for fsync elsewhere
        return
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def check_output_directory(path: str | Path, label: str) -> None:
    """Raise ``OutputPathError`` when ``path`` cannot become a directory because it, or one of
    its parents, is an existing file; ``label`` names the setting (``--output-dir``)."""
    path = Path(path)
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = "is" if candidate == path else f"lies below {candidate}, which is"
                raise OutputPathError(
                    f"{label} {path} {where} a file, not a directory; name a directory"
                )
            return


__all__ = [
    "DiskFullError",
    "OutputPathError",
    "check_output_directory",
    "fsync_directory",
    "fsync_file",
    "naming_full_disk",
]
