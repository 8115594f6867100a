"""The embedded assets: where they are in the installed package, and the tiny models' weight files.

Embedded weights are safetensors whose metadata holds the constructor kwargs (``{"config": json}``),
so a loader rebuilds the right architecture from the file alone.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn


def embedded_asset_path(name: str) -> Path:
    """Path of an embedded asset inside the installed ``genrl`` package (``genrl/assets/name``)."""
    try:
        root = resources.files("genrl")
        # A regular package gives a real directory; anything else falls back to the source tree.
        path = Path(str(root / "assets" / name))
        if path.parent.is_dir():
            return path
    except (ModuleNotFoundError, TypeError, NotADirectoryError):
        pass
    return Path(__file__).resolve().parents[1] / "genrl" / "assets" / name


def save_model(model: nn.Module, path: str | os.PathLike) -> None:
    """Write ``model`` as float32 safetensors with its constructor kwargs in the metadata."""
    from safetensors.torch import save_file

    tensors = {
        k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()
    }
    # A single metadata key with sorted JSON keeps the file byte-for-byte reproducible.
    save_file(tensors, str(path), metadata={"config": json.dumps(model.config, sort_keys=True)})


def build_command(embedded: str) -> str:
    """The command that rebuilds the embedded asset ``embedded``: the ``command`` of the
    nearest ``manifest.json`` above it (each asset folder names its own build script)."""
    folder = embedded_asset_path(embedded).parent
    root = embedded_asset_path("manifest.json").parent
    while True:
        manifest = folder / "manifest.json"
        try:
            command = json.loads(manifest.read_text(encoding="utf-8")).get("command")
            if isinstance(command, str):
                return command
        except (OSError, ValueError):
            pass
        if folder == root or folder.parent == folder:
            return "python scripts/build_assets.py"
        folder = folder.parent


def resolve_weights(path: str | os.PathLike | None, embedded: str) -> Path:
    """The weight file at ``path``, or the embedded asset ``embedded`` when ``path`` is None;
    ``FileNotFoundError`` (saying how to rebuild the embedded ones) when it is missing."""
    if path is None:
        resolved = embedded_asset_path(embedded)
        if not resolved.is_file():
            raise FileNotFoundError(
                f"embedded model weights not found at {resolved}; regenerate them with "
                f"`{build_command(embedded)}`"
            )
        return resolved
    resolved = Path(path)
    if not resolved.is_file():
        raise FileNotFoundError(f"model weights not found at {resolved}")
    return resolved


def load_model(model_cls: type[nn.Module], path: Path) -> Any:
    """``model_cls`` built from the kwargs in ``path``'s metadata, weights loaded strictly:
    CPU, float32, eval mode."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if "config" not in metadata:
        raise ValueError(f"{path} has no 'config' metadata; was it written by save_model()?")
    model = model_cls(**json.loads(metadata["config"]))
    model.load_state_dict(load_file(str(path)), strict=True)
    return model.float().eval()
