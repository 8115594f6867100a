"""Shared by the scripts that build the embedded transformers assets (``build_*_lm.py``): the
manifest of sha256s, ``--check`` against it, and ``--reproduce`` (rebuild in a temporary directory
and compare)."""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_entries(out: Path) -> dict[str, dict[str, Any]]:
    """``{name: {sha256, size_bytes}}`` of every file in ``out`` but the manifest."""
    names = sorted(p.name for p in out.iterdir() if p.name != MANIFEST)
    return {
        name: {"sha256": sha256(out / name), "size_bytes": (out / name).stat().st_size}
        for name in names
    }


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def check(out: Path, command: str, manifest: dict[str, Any] | None = None) -> int:
    """Exit status 0 when every file in the (given or shipped) manifest has its recorded sha256."""
    if manifest is None and not (out / MANIFEST).is_file():
        print(f"missing {out / MANIFEST}; run `{command}`")
        return 1
    status, manifest = 0, manifest or json.loads((out / MANIFEST).read_text())
    for name, entry in manifest["files"].items():
        path = out / name
        ok = path.is_file() and sha256(path) == entry["sha256"]
        status |= not ok
        print(f"{'ok' if ok else 'MISMATCH' if path.is_file() else 'MISSING':8} {path}")
    return status


def main(
    argv: list[str] | None,
    description: str,
    out_dir: Path,
    command: str,
    build: Callable[[Path], dict[str, Any]],
    rescore: Callable[[Path], dict[str, Any]] | None = None,
) -> int:
    """``build`` into ``--out``; ``--check`` the shipped files; ``--reproduce``: the shipped
    files must match a fresh build's sha256s; ``--rescore`` (when given): re-measure the
    shipped files' metrics into their manifest."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="verify shipped files vs manifest")
    parser.add_argument("--reproduce", action="store_true", help="rebuild and compare sha256s")
    parser.add_argument("--out", type=Path, default=out_dir, help="output directory")
    if rescore is not None:
        parser.add_argument("--rescore", action="store_true", help="re-measure the metrics")
    args = parser.parse_args(argv)
    if rescore is not None and args.rescore:
        rescore(args.out)
        return 0
    if args.check:
        return check(args.out, command)
    if args.reproduce:
        with tempfile.TemporaryDirectory() as tmp:
            return check(args.out, command, build(Path(tmp)))
    build(args.out)
    return 0
