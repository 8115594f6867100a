"""Within-prompt sample diversity: a metric to log next to a reward, not one to train on.

Reward hacking often shows as collapse: every sample of a prompt becomes the same picture that
the reward likes. ``SampleDiversity`` measures how different the samples of one prompt are in a
batch; give it weight 0 in a recipe's ``reward`` list so it is logged (``<reward>/mean`` while
training, ``eval/sample_diversity`` on the held-out set) without entering the training reward.
"""

from __future__ import annotations

from typing import Any

import torch

from reward_models.base import RewardModel, RewardOutput
from tasks.prompt import prompt_id


class SampleDiversity(RewardModel):
    """``sample_diversity`` of sample ``i``: its root-mean-square pixel distance to the other
    samples of the same prompt in the batch, averaged over them (0: all identical; images in
    ``[0, 1]`` give at most 1). Not applicable (NaN) to a sample whose prompt has no other
    sample in the batch. Prompts are told apart by ``prompt_id`` (text, and row for dataset
    rows). No weights, no gradients."""

    name = "sample_diversity"
    accepts = ("images", "videos")

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        if not isinstance(outputs, torch.Tensor):
            raise ValueError(f"{self.name}: expected an image or video tensor, got {type(outputs)}")
        flat = outputs.detach().float().flatten(1)
        index: dict[str, int] = {}
        ids = torch.tensor([index.setdefault(prompt_id(p), len(index)) for p in prompts])
        distance = torch.cdist(flat, flat) / flat.shape[1] ** 0.5  # [B, B] RMS differences
        same = (ids[:, None] == ids[None, :]) & ~torch.eye(len(prompts), dtype=torch.bool)
        others = same.sum(dim=1)
        mean = (distance * same).sum(dim=1) / others.clamp_min(1)
        applicable = others > 0
        score = torch.where(applicable, mean, torch.full_like(mean, float("nan")))
        return RewardOutput({self.name: score.cpu()}, {self.name: applicable.cpu()})
