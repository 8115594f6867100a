"""Digit-classifier reward for the embedded task: how surely a tiny CNN reads the prompt's digit."""

from __future__ import annotations

from typing import Any

import torch

from reward_models.base import RewardModel, RewardOutput


class DigitClassifierReward(RewardModel):
    """``digit_classifier`` = softmax probability of the prompt's digit; also logs
    ``accuracy`` (argmax equals the prompt's digit).

    Args:
        path: classifier safetensors file; None uses the embedded one.
        device: where to run the classifier.
    """

    name = "digit_classifier"
    accepts = ("images",)
    score_range = (0.0, 1.0)  # a probability

    def __init__(self, path: str | None = None, device: str | torch.device = "cpu") -> None:
        self.path = path
        self.device = torch.device(device)
        self._model: torch.nn.Module | None = None

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            from tasks.digits import load_classifier

            self._model = load_classifier(self.path).to(self.device).eval()
        return self._model

    @torch.no_grad()
    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        from tasks.digits import parse_prompt

        if outputs.ndim != 4 or tuple(outputs.shape[1:]) != (1, 8, 8):
            raise ValueError(
                f"{self.name}: expected images [B, 1, 8, 8] in [0, 1], got {tuple(outputs.shape)}"
            )
        parsed = {p: parse_prompt(p) for p in dict.fromkeys(prompts)}  # groups repeat prompts
        labels = torch.tensor([parsed[p] for p in prompts], device=self.device)
        probs = self.model(outputs.float().to(self.device)).softmax(dim=-1)
        target = probs.gather(1, labels[:, None]).squeeze(1)
        correct = (probs.argmax(dim=-1) == labels).float()
        return RewardOutput({self.name: target.cpu(), "accuracy": correct.cpu()})
