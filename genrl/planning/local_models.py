"""A model file made from a local checkpoint's own configs, so that ``genrl plan`` and a run's
report plan a fine-tune, a local copy or a tiny test model as they plan the files in ``models/``.

A diffusers pipeline folder (``model_index.json``) gives one component per module it lists, each
from its folder's ``config.json``, the ``transformer`` trained; a transformers folder
(``config.json``) is one trained component, its class the first of ``architectures``. Only the
constructor's arguments are kept, so the fake-tensor build is the model ``from_pretrained``
loads, without its weights.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

from torch import nn

from genrl.config.errors import ConfigError
from genrl.planning.modelling import ComponentSpec, ModelSpec

# The pipeline classes whose trained module ``workloads.FAMILIES`` knows how to call.
PIPELINE_FAMILIES = {
    "StableDiffusion3Pipeline": "sd3",
    "FluxPipeline": "flux",
    "QwenImagePipeline": "qwenimage",
    "WanPipeline": "wan",
}
# transformers ``model_type`` values planned as the ``vlm`` family (vision tower left out of LoRA).
VLM_MODEL_TYPES = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "idefics3", "smolvlm"}
# Policies whose checkpoints are masked-diffusion LMs (bidirectional; same module call).
MASKED_POLICIES = {"masked_lm", "sudoku_dllm"}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"policy.pretrained: cannot read {path}: {err}") from None
    return data


def _module_class(library: str, name: str) -> type | None:
    """The class ``library.name`` when it is a torch module (not a tokenizer or scheduler)."""
    if library not in ("diffusers", "transformers"):
        return None
    cls = getattr(importlib.import_module(library), name, None)
    return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None


def _constructor_config(cls: type, library: str, config: dict[str, Any]) -> dict[str, Any]:
    """The entries of a saved ``config.json`` that the class's constructor takes: diffusers
    models take their config as keyword arguments (the ``_``-prefixed keys are bookkeeping);
    transformers configs take every entry."""
    kept = {k: v for k, v in config.items() if not k.startswith("_")}
    if library == "transformers":
        return kept
    accepted = inspect.signature(cls).parameters  # the constructor's, without self
    return {k: v for k, v in kept.items() if k in accepted}


def _diffusers_spec(root: Path) -> ModelSpec:
    index = _read_json(root / "model_index.json")
    pipeline = str(index.get("_class_name", ""))
    family = PIPELINE_FAMILIES.get(pipeline)
    if family is None:
        raise ConfigError(
            f"policy.pretrained: genrl plan models the pipelines {', '.join(PIPELINE_FAMILIES)}; "
            f"{root} is a {pipeline or 'pipeline without _class_name'}"
        )
    components = []
    defaults: dict[str, Any] = {}
    for name, entry in index.items():
        if name.startswith("_") or not isinstance(entry, list) or None in entry:
            continue
        library, cls_name = entry
        cls = _module_class(library, cls_name)
        if cls is None:
            continue
        config = _read_json(root / name / "config.json")
        components.append(
            ComponentSpec(
                name,
                f"{library}:{cls_name}",
                _constructor_config(cls, library, config),
                trained=name == "transformer",
            )
        )
        if name == "transformer" and config.get("sample_size"):
            # SD3's sample_size counts latent pixels; its VAE downsamples by 8.
            defaults.update(height=8 * config["sample_size"], width=8 * config["sample_size"])
        if name == "vae" and config.get("scale_factor_spatial"):
            defaults["vae_spatial"] = config["scale_factor_spatial"]  # Wan 2.2's 16x VAE
    if not any(c.trained for c in components):
        raise ConfigError(f"policy.pretrained: {root}/model_index.json lists no transformer")
    return ModelSpec(
        key=root.name,
        name=f"{pipeline} at {root}",
        checkpoints=(),
        family=family,
        defaults=defaults,
        components=tuple(components),
        source=f"{root}: model_index.json and each component's config.json",
    )


def _transformers_spec(root: Path, policy_name: str | None) -> ModelSpec:
    config = _read_json(root / "config.json")
    architectures = config.get("architectures") or []
    cls = _module_class("transformers", architectures[0]) if architectures else None
    if cls is None:
        raise ConfigError(
            f"policy.pretrained: {root}/config.json names no transformers model class in "
            f"'architectures' ({architectures or 'none'})"
        )
    if policy_name in MASKED_POLICIES:
        family = "masked_lm"
    elif config.get("model_type") in VLM_MODEL_TYPES:
        family = "vlm"
    else:
        family = "causal_lm"
    component = ComponentSpec(
        "model",
        f"transformers:{architectures[0]}",
        _constructor_config(cls, "transformers", config),
        trained=True,
    )
    return ModelSpec(
        key=root.name,
        name=f"{architectures[0]} at {root}",
        checkpoints=(),
        family=family,
        defaults={},
        components=(component,),
        source=f"{root}: config.json",
    )


def spec_from_directory(path: str | Path, policy_name: str | None = None) -> ModelSpec:
    """The model file of the checkpoint saved in ``path`` (``save_pretrained``'s layout);
    ``policy_name`` tells a masked-diffusion LM from a causal one (same config class)."""
    root = Path(path)
    if (root / "model_index.json").is_file():
        return _diffusers_spec(root)
    if (root / "config.json").is_file():
        return _transformers_spec(root, policy_name)
    raise ConfigError(
        f"policy.pretrained: {root} holds neither model_index.json (a diffusers pipeline) nor "
        "config.json (a transformers model)"
    )
