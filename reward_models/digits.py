"""Digit-classifier reward for the embedded task: how surely a tiny CNN reads the prompt's digit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from reward_models.base import RewardInputError, RewardModel, RewardOutput


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
    image_channels = (1,)  # the task's grayscale digits
    image_size = (8, 8)  # the classifier's input

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

    def check_prompts(self, prompts: Sequence[str], metadata: Sequence[Any] | None) -> None:
        del metadata
        self.labels(prompts)

    def labels(self, prompts: Sequence[str]) -> list[int]:
        """The digit each prompt names; ``RewardInputError`` for one naming none (or several)."""
        from tasks.digits import parse_prompt

        parsed: dict[str, int] = {}
        for index, prompt in enumerate(prompts):
            if prompt in parsed:  # groups repeat prompts
                continue
            try:
                parsed[prompt] = parse_prompt(prompt)
            except ValueError as err:
                raise RewardInputError(f"{self.name} cannot score prompt {index}: {err}") from None
        return [parsed[p] for p in prompts]

    @torch.no_grad()
    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        labels = torch.tensor(self.labels(prompts), device=self.device)
        probs = self.model(outputs.float().to(self.device)).softmax(dim=-1)
        target = probs.gather(1, labels[:, None]).squeeze(1)
        correct = (probs.argmax(dim=-1) == labels).float()
        return RewardOutput({self.name: target.cpu(), "accuracy": correct.cpu()})
