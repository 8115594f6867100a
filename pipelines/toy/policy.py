"""Flow-policy adapter for the embedded digits generator (``pipelines.toy.models``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from pipelines.base import Condition, FlowPolicy
from pipelines.toy.export import export_toy
from pipelines.toy.models import DigitFlowModel, load_flow_model, to_pixels
from tasks.digits import parse_prompt


class ToyDigitsPolicy(FlowPolicy):
    """Class-conditional 8x8 digit generator; the prompt's digit is the condition.

    Args:
        pretrained: path of a ``digits_flow`` safetensors file; None uses the embedded weights.
        dtype: only ``float32`` (the model is 660k parameters).
        gradient_checkpointing: not offered (its activations are a few kilobytes).
    """

    latent_shape = (1, 8, 8)

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if dtype != "float32":
            raise ValueError(f"the embedded digits model runs in float32, not {dtype}")
        if gradient_checkpointing:
            raise ValueError("the embedded digits model has no gradient checkpointing")
        self.network: nn.Module = load_flow_model(pretrained)
        self._base = str(pretrained) if pretrained else "embedded:digits_flow"
        self.network.requires_grad_(False)
        self.module = self.network
        self.num_classes = _base_model(self.network).num_classes

    def encode_prompts(self, prompts: list[str]) -> Condition:
        # Each prompt recurs group_size times in a batch: parse the distinct ones once.
        labels = {p: parse_prompt(p) for p in dict.fromkeys(prompts)}
        return {
            "labels": torch.tensor(
                [labels[p] for p in prompts], dtype=torch.long, device=self.device
            )
        }

    def null_condition(self, condition: Condition) -> Condition:
        return {"labels": torch.full_like(condition["labels"], self.num_classes)}

    def forward_model(
        self, module: nn.Module, latents: torch.Tensor, sigma: torch.Tensor, condition: Condition
    ) -> torch.Tensor:
        return module(latents, sigma, condition["labels"])

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return to_pixels(latents)

    def default_lora_targets(self) -> list[str]:
        return list(DigitFlowModel.lora_target_modules)

    def export(self, directory: str | Path) -> Path:
        """``trainable.safetensors``, plus peft's ``adapter_config.json`` and
        ``adapter_model.safetensors`` for a LoRA run (``pipelines.toy.export``)."""
        return export_toy(self, directory, self._base)


def _base_model(module: nn.Module) -> DigitFlowModel:
    get_base_model = getattr(module, "get_base_model", None)  # a peft wrapper
    base = get_base_model() if get_base_model is not None else module
    assert isinstance(base, DigitFlowModel)
    return base
