"""A pixel-statistics reward: closeness of an image's colours to a target colour.

It needs no weights, so it serves as the reward of smoke tests and demos on tiny random image
models (where a learned reward would be just as random as the generator).
"""

from __future__ import annotations

from typing import Any

import torch

from reward_models.base import RewardModel, RewardOutput


class TargetColorReward(RewardModel):
    """``target_color = 1 - mean_pixels ||rgb - target||^2 / 3``, in ``[0, 1]``; 1 when every
    pixel is the target colour.

    Args:
        target: RGB in ``[0, 1]``; default pure red.
    """

    name = "target_color"
    accepts = ("images",)
    image_channels = (3,)  # a distance to an RGB colour

    def __init__(self, target: tuple[float, float, float] | list[float] = (1.0, 0.0, 0.0)) -> None:
        if len(target) != 3 or not all(0.0 <= c <= 1.0 for c in target):
            raise ValueError(f"target_color: target must be three numbers in [0, 1], got {target}")
        self.target = torch.tensor([float(c) for c in target])

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del prompts, metadata
        if outputs.ndim != 4 or outputs.shape[1] != 3:
            raise ValueError(
                f"{self.name}: expected RGB images [B, 3, H, W] in [0, 1], "
                f"got {tuple(outputs.shape)}"
            )
        target = self.target.to(outputs.device, torch.float32).view(1, 3, 1, 1)
        distance = (outputs.float() - target).square().sum(dim=1).mean(dim=(1, 2))
        return RewardOutput({self.name: 1 - distance / 3})
