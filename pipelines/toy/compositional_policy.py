"""Flow-policy adapter for the compositional task's generator (``pipelines.toy.compositional``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from pipelines.base import Condition, FlowPolicy
from pipelines.toy.compositional import (
    CompositionalFlowModel,
    load_compositional_model,
    null_tokens,
    tokenize,
)
from pipelines.toy.export import export_toy
from pipelines.toy.models import to_pixels


class ToyCompositionalPolicy(FlowPolicy):
    """32x32 RGB scenes from prompts like "a photo of a red circle left of a blue square":
    latents are the canvases themselves, ``[B, 3, 32, 32]`` in ``[-1, 1]``; ``decode`` gives
    images in ``[0, 1]``. The condition is the prompt's token ids, read by the model's own text
    encoder (so LoRA and full fine-tuning reach the text path too); the null prompt gives the
    unconditional branch of classifier-free guidance.

    Args:
        pretrained: path of a compositional flow safetensors file; None uses the embedded one.
        dtype: only ``float32``.
        gradient_checkpointing: not offered (activations are a few kilobytes per canvas).
    """

    latent_shape = (3, 32, 32)

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if dtype != "float32":
            raise ValueError(f"the embedded compositional model runs in float32, not {dtype}")
        if gradient_checkpointing:
            raise ValueError("the embedded compositional model has no gradient checkpointing")
        self.network: nn.Module = load_compositional_model(pretrained)
        self._base = str(pretrained) if pretrained else "embedded:compositional_flow"
        self.network.requires_grad_(False)
        self.module = self.network
        self.latent_shape = _base_model(self.network).event_shape

    def encode_prompts(self, prompts: list[str]) -> Condition:
        return {"tokens": tokenize(prompts, self.device)}

    def null_condition(self, condition: Condition) -> Condition:
        tokens = condition["tokens"]
        return {"tokens": null_tokens(tokens.shape[0], tokens.device)}

    def forward_model(
        self, module: nn.Module, latents: torch.Tensor, sigma: torch.Tensor, condition: Condition
    ) -> torch.Tensor:
        return module(latents, sigma, condition["tokens"])

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return to_pixels(latents)

    def default_lora_targets(self) -> list[str]:
        return list(CompositionalFlowModel.lora_target_modules)

    def export(self, directory: str | Path) -> Path:
        """``trainable.safetensors``, plus peft's ``adapter_config.json`` and
        ``adapter_model.safetensors`` for a LoRA run (``pipelines.toy.export``)."""
        return export_toy(self, directory, self._base)


def _base_model(module: nn.Module) -> CompositionalFlowModel:
    get_base_model = getattr(module, "get_base_model", None)  # a peft wrapper
    base = get_base_model() if get_base_model is not None else module
    assert isinstance(base, CompositionalFlowModel)
    return base
