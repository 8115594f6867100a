"""Export of a trained diffusers flow adapter in diffusers' own formats.

LoRA: diffusers LoRA weights that ``pipe.load_lora_weights(directory)`` loads into the stock
pipeline (with adapter metadata where diffusers supports it, so that our ``lora_alpha`` holds).
Full fine-tune: the transformer's ``save_pretrained`` in ``directory/transformer``.
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
    from peft.utils import get_peft_model_state_dict

    state = get_peft_model_state_dict(policy.network)
    prefix = "base_model.model."
    state = {k.removeprefix(prefix): v.detach().cpu().contiguous() for k, v in state.items()}
    config: Any = cast(Any, policy.network).peft_config["default"]  # a peft LoraConfig
    kwargs: dict[str, Any] = {"transformer_lora_layers": state}
    save = type(policy.pipe).save_lora_weights
    if "transformer_lora_adapter_metadata" in inspect.signature(save).parameters:
        # Keeps lora_alpha and the targets, so a loaded adapter has our scaling.
        kwargs["transformer_lora_adapter_metadata"] = _lora_metadata(config)
    elif config.lora_alpha != config.r:
        # Older diffusers load every adapter with alpha = r: fold our alpha / r into B.
        scale = config.lora_alpha / config.r
        state = {k: v * scale if ".lora_B." in k else v for k, v in state.items()}
        kwargs["transformer_lora_layers"] = state
    save(str(directory), **kwargs)
    return directory


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
