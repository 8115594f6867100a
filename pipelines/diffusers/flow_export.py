"""Export of a trained diffusers flow adapter in diffusers' own formats.

LoRA: diffusers LoRA weights that ``pipe.load_lora_weights(directory)`` loads into the stock
pipeline (with adapter metadata where diffusers supports it, so that our ``lora_alpha`` holds).
Full fine-tune: the transformer's ``save_pretrained`` in ``directory/transformer``. Pipelines
without a LoRA loader (``HunyuanVideo15Pipeline`` in diffusers 0.42) get the same file, which
``pipe.transformer.load_lora_adapter(directory, prefix="transformer",
weight_name="pytorch_lora_weights.safetensors")`` loads.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, cast


def export_diffusers(policy: Any, directory: str | Path) -> Path:
    """Write ``policy``'s trained weights (a ``FlowImagePolicy``) under ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if not policy.is_lora:
        policy.pipe.transformer.save_pretrained(directory / "transformer")
        return directory
    write_lora(policy, directory, lora_state(policy))
    return directory


def lora_state(policy: Any) -> dict[str, Any]:
    """The LoRA weights of ``policy.network`` under the wrapped module's own names."""
    from peft.utils import get_peft_model_state_dict

    state = get_peft_model_state_dict(policy.network)
    prefix = "base_model.model."
    return {k.removeprefix(prefix): v.detach().cpu().contiguous() for k, v in state.items()}


def write_lora(
    policy: Any, directory: Path, state: dict[str, Any], targets: list[str] | None = None
) -> None:
    """``state`` (a transformer's LoRA weights) as the pipeline's ``save_lora_weights`` writes
    them into ``directory``, with ``policy.network``'s LoRA rank and alpha, and its targets
    (or ``targets``: names as the stock transformer calls its modules)."""
    directory.mkdir(parents=True, exist_ok=True)
    config: Any = cast(Any, policy.network).peft_config["default"]  # a peft LoraConfig
    metadata = _lora_metadata(config)
    if targets is not None:
        metadata["target_modules"] = sorted(targets)
    kwargs: dict[str, Any] = {"transformer_lora_layers": state}
    save = getattr(type(policy.pipe), "save_lora_weights", None)
    if save is None:
        _write_lora_file(directory, state, metadata)
        return
    if "transformer_lora_adapter_metadata" in inspect.signature(save).parameters:
        # Keeps lora_alpha and the targets, so a loaded adapter has our scaling.
        kwargs["transformer_lora_adapter_metadata"] = metadata
    elif config.lora_alpha != config.r:
        # Older diffusers load every adapter with alpha = r: fold our alpha / r into B.
        scale = config.lora_alpha / config.r
        state = {k: v * scale if ".lora_B." in k else v for k, v in state.items()}
        kwargs["transformer_lora_layers"] = state
    save(str(directory), **kwargs)


def _lora_metadata(config: Any) -> dict[str, Any]:
    targets = config.target_modules
    return {
        "r": config.r,
        "lora_alpha": config.lora_alpha,
        "target_modules": sorted(targets) if isinstance(targets, set | list) else targets,
        "lora_dropout": config.lora_dropout,
        "bias": config.bias,
        "use_dora": getattr(config, "use_dora", False),
    }


def _write_lora_file(directory: Path, state: dict[str, Any], metadata: dict[str, Any]) -> None:
    """What ``save_lora_weights`` writes for a transformer's LoRA: keys and adapter metadata
    under the ``transformer.`` prefix, the metadata as JSON in the safetensors header
    (diffusers' ``LoraBaseMixin.write_lora_layers``)."""
    import json

    from diffusers.loaders.lora_base import LORA_ADAPTER_METADATA_KEY
    from safetensors.torch import save_file

    weights = {f"transformer.{k}": v for k, v in state.items()}
    packed = json.dumps({f"transformer.{k}": v for k, v in metadata.items()}, sort_keys=True)
    header = {"format": "pt", LORA_ADAPTER_METADATA_KEY: packed}
    save_file(weights, str(directory / "pytorch_lora_weights.safetensors"), metadata=header)
