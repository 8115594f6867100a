"""GDRO's reward-hacking-aware corrected score (Wang et al. 2026, arXiv 2601.02036, sec. 5).

A reward can rise while images get worse (oversized text for OCR, lost detail). GDRO scores
evaluations with ``r * (u - pivot) + offset``, where ``u`` is the mean of quality sub-scores on a
1-5 scale (the paper: UnifiedReward's alignment, coherence and style for OCR; coherence and style
for GenEval) and pivot 3, offset 0.2 (a plotting offset). A hacked sample with a high ``r`` but
quality below the pivot then scores below an honest one. Use it with weight 0 next to the
training reward so it appears in the held-out metrics (``eval/corrected_score``) without
changing the training signal.
"""

from __future__ import annotations

from typing import Any

import torch

from reward_models.base import RewardModel, RewardOutput


class CorrectedScore(RewardModel):
    """``reward * (mean(quality sub-scores) - pivot) + offset``.

    Args:
        reward: the task reward; given to ``build_reward`` as a spec,
            ``{"name": ..., "kwargs": {...}}``, which the registry builds (``nested_rewards``).
        quality: the quality reward (e.g. a ``remote`` UnifiedReward server), likewise.
        quality_scores: which of the quality reward's scores to average (default: its primary).
        pivot: quality at which the correction changes sign (paper: 3 on a 1-5 scale).
        offset: added constant (paper: 0.2).
        device: handed by the registry to the inner rewards that take one and whose spec
            leaves it unset (the trainer passes this process's accelerator).

    Samples for which the task reward is not applicable are not applicable here either.
    """

    name = "corrected_score"
    nested_rewards = ("reward", "quality")
    """Arguments that ``build_reward`` builds from specs before this class sees them."""

    def __init__(
        self,
        reward: RewardModel,
        quality: RewardModel,
        quality_scores: list[str] | None = None,
        pivot: float = 3.0,
        offset: float = 0.2,
        device: Any = "cpu",
    ) -> None:
        del device  # used by the registry, for the inner rewards
        for value in (reward, quality):
            if not isinstance(value, RewardModel):
                raise TypeError(
                    "corrected_score takes built rewards; give specs to "
                    "build_reward('corrected_score', reward={...}, quality={...})"
                )
        self.reward, self.quality = reward, quality
        self.quality_scores = quality_scores or [self.quality.name]
        self.pivot, self.offset = pivot, offset
        # Both inner rewards score the same outputs.
        self.accepts = tuple(k for k in self.reward.accepts if k in self.quality.accepts)

    def score(
        self, outputs: Any, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        task_output = self.reward(outputs, prompts, metadata)
        task = task_output.scores[self.reward.name].float().cpu()
        quality_scores = self.quality(outputs, prompts, metadata).scores
        missing = [k for k in self.quality_scores if k not in quality_scores]
        if missing:
            raise ValueError(
                f"corrected_score: the quality reward {self.quality.name!r} returned "
                f"{sorted(quality_scores)}, not {missing}"
            )
        quality = torch.stack([quality_scores[k].float().cpu() for k in self.quality_scores])
        mean_quality = quality.mean(dim=0)
        corrected = task * (mean_quality - self.pivot) + self.offset
        applicable = {}
        if self.reward.name in task_output.applicable:
            applicable[self.name] = task_output.applicable[self.reward.name].cpu()
        return RewardOutput(
            {self.name: corrected, "reward": task, "quality": mean_quality}, applicable
        )
