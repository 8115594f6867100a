"""Flow-policy adapter for the embedded moving-digits video generator (``pipelines.toy.video``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from pipelines.base import Condition, FlowPolicy
from pipelines.toy.export import export_toy
from pipelines.toy.models import to_pixels
from pipelines.toy.video import (
    CANVAS,
    FRAMES,
    NUM_DIRECTIONS,
    MovingDigitFlowModel,
    load_video_flow_model,
)
from tasks.video_digits import parse_video_prompt


class ToyVideoDigitsPolicy(FlowPolicy):
    """Clips of a digit moving as the prompt says ("a 3 moving left"): latents are the clips
    themselves, ``[B, 6, 1, 16, 16]`` in ``[-1, 1]``; ``decode`` gives videos ``[B, F, 1, H, W]``
    in ``[0, 1]``. The condition is the prompt's (digit, direction); null labels give the
    unconditional branch of classifier-free guidance.

    Args:
        pretrained: path of a ``moving_digits_flow`` safetensors file; None uses the embedded one.
        dtype: only ``float32``.
        gradient_checkpointing: not offered (activations are a few kilobytes per clip).
    """

    latent_shape = (FRAMES, 1, CANVAS, CANVAS)

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if dtype != "float32":
            raise ValueError(f"the embedded video model runs in float32, not {dtype}")
        if gradient_checkpointing:
            raise ValueError("the embedded video model has no gradient checkpointing")
        self.network: nn.Module = load_video_flow_model(pretrained)
        self._base = str(pretrained) if pretrained else "embedded:moving_digits_flow"
        self.network.requires_grad_(False)
        self.module = self.network
        base = _base_model(self.network)
        # A checkpoint of another clip size would not match the rollouts' noise.
        self.latent_shape = base.event_shape
        self.null_digit, self.null_direction = base.num_digits, NUM_DIRECTIONS

    def encode_prompts(self, prompts: list[str]) -> Condition:
        # Each prompt recurs group_size times in a batch: parse the distinct ones once.
        parsed = {p: parse_video_prompt(p) for p in dict.fromkeys(prompts)}
        labels = torch.tensor([parsed[p] for p in prompts], dtype=torch.long, device=self.device)
        return {"digits": labels[:, 0].contiguous(), "directions": labels[:, 1].contiguous()}

    def null_condition(self, condition: Condition) -> Condition:
        return {
            "digits": torch.full_like(condition["digits"], self.null_digit),
            "directions": torch.full_like(condition["directions"], self.null_direction),
        }

    def forward_model(
        self, module: nn.Module, latents: torch.Tensor, sigma: torch.Tensor, condition: Condition
    ) -> torch.Tensor:
        return module(latents, sigma, condition["digits"], condition["directions"])

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latent clips ``[B, F, 1, H, W]`` -> videos ``[B, F, 1, H, W]`` in ``[0, 1]``."""
        return to_pixels(latents)

    def default_lora_targets(self) -> list[str]:
        return list(MovingDigitFlowModel.lora_target_modules)

    def export(self, directory: str | Path) -> Path:
        """``trainable.safetensors``, plus peft's ``adapter_config.json`` and
        ``adapter_model.safetensors`` for a LoRA run (``pipelines.toy.export``)."""
        return export_toy(self, directory, self._base)


def _base_model(module: nn.Module) -> MovingDigitFlowModel:
    get_base_model = getattr(module, "get_base_model", None)  # a peft wrapper
    base = get_base_model() if get_base_model is not None else module
    assert isinstance(base, MovingDigitFlowModel)
    return base
