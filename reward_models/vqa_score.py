"""VQAScore: a VLM judges whether an image shows its prompt.

Lin et al., "Evaluating Text-to-Visual Generation with Image-to-Text Generation" (2024, arXiv
2404.01291): the score of an image for a text is the probability that a VLM answers "Yes" to
``Does this figure show "{text}"? Please answer Yes or No.``; the reference implementation
(``t2v_metrics``, ``models/vqascore_models/qwen2vl_model.py`` and the other backends, question
template and answer ``Yes``) reads it from the answer token's softmax over the whole
vocabulary. That is this reward's default; ``normalize=True`` divides by ``P(yes) + P(no)``
instead, as ``artifact_judge`` does. UnifiedReward-style judges that answer a rubric of
questions per prompt are ``rubric`` rewards with judge criteria (``reward_models/rubric/reward.py``).

Both back-ends of ``artifact_judge``: a local transformers VLM (batched forwards) or an
OpenAI-compatible endpoint (concurrent requests, ``top_logprobs``).
"""

from __future__ import annotations

from typing import Any

import torch

from reward_models.base import RewardOutput
from reward_models.judge import ArtifactJudgeReward

VQASCORE_QUESTION = 'Does this figure show "{prompt}"? Please answer Yes or No.'


class VQAScoreReward(ArtifactJudgeReward):
    """``P(Yes)`` of a VLM asked whether the image shows the sample's prompt.

    Args:
        question: the template; ``{prompt}`` is replaced by the sample's prompt.
        normalize: report ``P(yes) / (P(yes) + P(no))`` instead of ``P(yes)``.
        **judge: ``artifact_judge``'s arguments (``model`` or ``endpoint``, ``batch_size``,
            ``device``, ``dtype``, endpoint settings).
    """

    name = "vqa_score"
    accepts = ("images",)

    def __init__(
        self,
        model: str | None = None,
        endpoint: str | None = None,
        question: str = VQASCORE_QUESTION,
        normalize: bool = False,
        device: str | torch.device = "cpu",
        **judge: Any,
    ) -> None:
        if "{prompt}" not in question:
            raise ValueError(f"vqa_score: the question must contain {{prompt}}, got {question!r}")
        # ``device`` is named so that the trainer hands a local judge its accelerator.
        super().__init__(model=model, endpoint=endpoint, question=question, device=device, **judge)
        self.normalize = normalize

    def questions(self, prompts: list[str]) -> list[str]:
        return [self.question.replace("{prompt}", str(p)) for p in prompts]

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del metadata
        questions = self.questions(prompts)
        p_yes = self.p_yes(outputs, questions)
        return RewardOutput({self.name: p_yes}, {self.name: torch.isfinite(p_yes)})


__all__ = ["VQASCORE_QUESTION", "VQAScoreReward"]
