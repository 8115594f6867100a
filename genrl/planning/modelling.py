"""Real-size models built from their configs on fake tensors: no weight is allocated or read.

A model is a JSON file in ``genrl/planning/models/`` (``README.md`` there names the public
``config.json`` each was copied from): its hub ids (``checkpoints``), the ``family`` that says how
its trained module is called (``genrl/planning/workloads.py``), and its components, each a
``"library:Class"`` with the constructor's config, or ``{"file": name}`` for a component shared
between models (the T5 encoder of SD3 and FLUX). One component is ``trained``; the others are
frozen (text encoders, VAE) and only their parameters are counted.

Construction happens under a ``FakeTensorMode``: parameters are fake tensors with real shapes
and dtypes and no storage, so a 14B transformer is built in seconds in a few hundred MB.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from genrl.config.errors import ConfigError

MODELS_DIR = Path(__file__).resolve().parent / "models"


@dataclass(frozen=True)
class ComponentSpec:
    """One component of a model: its class (``"diffusers:SD3Transformer2DModel"``), the keyword
    arguments of its constructor, and whether training updates it."""

    name: str
    cls: str
    config: dict[str, Any]
    trained: bool


@dataclass(frozen=True)
class ModelSpec:
    """A model file: its display name, hub ids, family, defaults (sizes the adapter uses when the
    recipe sets none) and components."""

    key: str
    name: str
    checkpoints: tuple[str, ...]
    family: str
    defaults: dict[str, Any]
    components: tuple[ComponentSpec, ...]
    source: str

    @property
    def trained(self) -> ComponentSpec:
        return next(c for c in self.components if c.trained)

    @property
    def frozen(self) -> tuple[ComponentSpec, ...]:
        return tuple(c for c in self.components if not c.trained)


def _read(key: str) -> dict[str, Any]:
    path = MODELS_DIR / f"{key}.json"
    if not path.is_file():
        raise ConfigError(f"no model config {key!r} in {MODELS_DIR}")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _component(name: str, entry: dict[str, Any]) -> ComponentSpec:
    trained = bool(entry.get("trained", False))
    if "file" in entry:
        entry = _read(entry["file"])
    return ComponentSpec(name, entry["class"], dict(entry["config"]), trained)


def load_model_spec(key: str) -> ModelSpec:
    """The model file ``models/<key>.json``. A file without ``components`` (a VLM that is also
    another model's text encoder) is one trained component."""
    data = _read(key)
    entries = data.get("components") or {"model": {**data, "trained": True}}
    return ModelSpec(
        key=key,
        name=data["name"],
        checkpoints=tuple(data.get("checkpoints", ())),
        family=data["family"],
        defaults=dict(data.get("defaults", {})),
        components=tuple(_component(n, e) for n, e in entries.items()),
        source=data["source"],
    )


@cache
def model_keys() -> tuple[str, ...]:
    """Every model file that names hub checkpoints (the shared components name none)."""
    keys = []
    for path in sorted(MODELS_DIR.glob("*.json")):
        if json.loads(path.read_text()).get("checkpoints"):
            keys.append(path.stem)
    return tuple(keys)


def spec_for_checkpoint(checkpoint: str | None) -> ModelSpec | None:
    """The model file listing this hub id (also matched by its last path part, so that a local
    copy ``/models/FLUX.1-dev`` finds FLUX), or None."""
    if not checkpoint:
        return None
    tail = checkpoint.rstrip("/").rsplit("/", 1)[-1].lower()
    for key in model_keys():
        spec = load_model_spec(key)
        if checkpoint in spec.checkpoints or tail in {
            c.rsplit("/", 1)[-1].lower() for c in spec.checkpoints
        }:
            return spec
    return None


def build_component(spec: ComponentSpec, dtype: torch.dtype) -> nn.Module:
    """The component's module with its parameters in ``dtype``; call it inside a
    ``FakeTensorMode`` (or a ``torch.device("meta")``) to build it without memory."""
    library, _, cls_name = spec.cls.partition(":")
    if library not in ("diffusers", "transformers"):
        raise ConfigError(f"component {spec.name}: unknown library {library!r}")
    cls = getattr(importlib.import_module(library), cls_name)
    if library == "transformers":
        config_cls = cls.config_class
        config = config_cls(**spec.config)
        config._attn_implementation = "sdpa"  # what the adapters load with (fused attention)
        module = cls(config)
    else:
        module = cls(**spec.config)
    set_dtype(module, dtype)
    return module


def set_dtype(module: nn.Module, dtype: torch.dtype) -> None:
    """Every floating parameter and buffer in ``dtype``. Assigned through ``.data``:
    ``Module.to`` swaps tensors, which fake tensors refuse."""
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.is_floating_point() and tensor.dtype != dtype:
            tensor.data = tensor.data.to(dtype)


class LoRALinear(nn.Module):
    """``base(x) + scale * B(A(x))`` with the base frozen: the layer peft's ``LoraConfig``
    (dropout 0, no bias) puts on a matched ``nn.Linear`` (Hu et al. 2021, eq. 3), rebuilt here
    because peft's ``.to(device)`` swaps tensors, which fake tensors refuse."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scale * self.lora_B(self.lora_A(x))


def lora_matches(name: str, targets: list[str]) -> bool:
    """peft's rule for a list of ``target_modules``: the module's qualified name equals a
    target or ends with ``"." + target``."""
    return any(name == t or name.endswith("." + t) for t in targets)


def add_lora(module: nn.Module, rank: int, alpha: float, targets: list[str]) -> int:
    """Freeze ``module`` and wrap every ``nn.Linear`` that ``targets`` match; returns the number
    of layers wrapped. The adapter's weights are float32, as genrl trains them."""
    module.requires_grad_(False)
    matched = [
        (name, child)
        for name, child in module.named_modules()
        if isinstance(child, nn.Linear) and lora_matches(name, targets)
    ]
    for name, child in matched:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        wrapped = LoRALinear(child, rank, alpha or 2 * rank)
        set_dtype(wrapped.lora_A, torch.float32)
        set_dtype(wrapped.lora_B, torch.float32)
        setattr(parent, attr, wrapped)
    return len(matched)


def default_lora_targets(family_targets: list[str] | None, module: nn.Module) -> list[str]:
    """The adapter's default targets: its family's list, or every linear layer (the base
    adapter's default)."""
    if family_targets is not None:
        return list(family_targets)
    return [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]


def repeated_blocks(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks, the units FSDP wraps one by one (``fsdp2_*.yaml``:
    ``TRANSFORMER_BASED_WRAP``): the children of every ``nn.ModuleList`` with at least two
    entries."""
    blocks: list[nn.Module] = []
    for child in module.modules():
        nested = any(child is b or _contains(b, child) for b in blocks)
        if isinstance(child, nn.ModuleList) and len(child) >= 2 and not nested:
            blocks.extend(child)
    return blocks


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def parameter_bytes(module: nn.Module, trainable: bool | None = None) -> int:
    """Bytes of the parameters (all, or only the trainable / frozen ones)."""
    return sum(
        p.numel() * p.element_size()
        for p in module.parameters()
        if trainable is None or p.requires_grad == trainable
    )


def parameter_count(module: nn.Module, trainable: bool | None = None) -> int:
    return sum(
        p.numel() for p in module.parameters() if trainable is None or p.requires_grad == trainable
    )


_SIZE = re.compile(r"^\s*([0-9.]+)\s*(gib|gb|g|mib|mb|m)?\s*$", re.IGNORECASE)


def parse_memory(text: str) -> int:
    """``"80GB"`` / ``"80"`` / ``"141 GiB"`` in bytes. GB is read as GiB: GPUs sold as 80 GB
    hold 80 GiB (an H100 80GB reports 79.6 GiB usable)."""
    m = _SIZE.match(text)
    if not m:
        raise ConfigError(f"--gpu-memory: expected a size such as 80GB, got {text!r}")
    value, unit = float(m.group(1)), (m.group(2) or "gb").lower()
    scale = 2**20 if unit.startswith("m") else 2**30
    return int(value * scale)
