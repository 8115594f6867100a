"""Export of the embedded toy policies: the trainable weights as ``trainable.safetensors``
(what ``genrl`` reloads) and, for a LoRA run, the adapter in peft's own layout
(``adapter_config.json`` + ``adapter_model.safetensors``), so that
``PeftModel.from_pretrained(base_model, directory)`` loads it without genrl."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def export_toy(policy: Any, directory: str | Path, base: str) -> Path:
    """Write ``policy``'s export into ``directory`` and return it. ``base`` names the base
    model's weights in ``adapter_config.json`` (its path, or ``embedded:<name>``)."""
    from pipelines.base import TrainablePolicy

    out = TrainablePolicy.export(policy, directory)
    if policy.is_lora:
        for config in policy.network.peft_config.values():
            config.base_model_name_or_path = base
        # No embedding layers here to save; saying so skips peft's look-up of a base config.
        policy.network.save_pretrained(str(out), save_embedding_layers=False)
    return out
