"""Artifact reward in its VLM-judge form: ask a vision-language model whether an image has
artifacts and read the answer from one token's probabilities,

    artifact_judge = 1 - P(yes) / (P(yes) + P(no)),

where ``P(yes)`` sums the next-token probabilities of the answer's "yes" spellings ("Yes",
"yes", with and without a leading space) and likewise for "no". Normalising over the two
answers removes the mass a model puts on other tokens; a judge that names neither gets NaN
(not applicable).

The questions go to ``reward_models.judge_backend.JudgeBackend``, the back-end every judge
shares: a local transformers VLM (``model``: any ``AutoModelForImageTextToText`` checkpoint with
a chat template, e.g. Qwen2.5-VL or LLaVA; batched forwards, last position's logits) or an
OpenAI-compatible endpoint (``endpoint``: vLLM, SGLang or a hosted API; one chat completion per
image with ``max_tokens=1`` and ``top_logprobs``, concurrent, retried). ``vqa_score`` and
``video_judge`` are this class with other questions.
"""

from __future__ import annotations

from typing import Any

import torch

from reward_models.base import RewardModel, RewardOutput
from reward_models.judge_backend import JudgeBackend

DEFAULT_QUESTION = (
    "Does this image contain visual artifacts, such as distorted or extra limbs, garbled text, "
    "noise, blur or duplicated objects? Answer Yes or No."
)


class ArtifactJudgeReward(RewardModel):
    """``1 - P(yes)`` of a VLM asked whether the image has artifacts.

    Args:
        model: local transformers VLM checkpoint (hub id or directory); or
        endpoint: base URL of an OpenAI-compatible API (exactly one of the two).
        question: what the judge is asked.
        batch_size: local images per forward.
        **judge: the rest of ``JudgeBackend``'s arguments (``endpoint_model``, ``yes_words``,
            ``no_words``, ``api_key_env``, ``dtype``, ``trust_remote_code``, ``top_logprobs``,
            ``timeout_s``, ``retries``, ``concurrency``).
    """

    name = "artifact_judge"
    accepts = ("images",)
    normalize = True
    """Report ``P(yes) / (P(yes) + P(no))`` (True) or ``P(yes)`` over the whole vocabulary."""

    def __init__(
        self,
        model: str | None = None,
        endpoint: str | None = None,
        question: str = DEFAULT_QUESTION,
        device: str | torch.device = "cpu",
        batch_size: int = 8,
        **judge: Any,
    ) -> None:
        self.question = question
        self.backend = JudgeBackend(
            model=model, endpoint=endpoint, device=device, batch_size=batch_size,
            owner=self.name, **judge,
        )  # fmt: skip

    @property
    def endpoint(self) -> str | None:
        return self.backend.endpoint

    def p_yes(self, images: torch.Tensor, questions: list[str] | None = None) -> torch.Tensor:
        """``[B]`` P(yes) for ``[B, C, H, W]`` images, each asked ``questions[i]`` (default:
        ``question``)."""
        asked = questions if questions is not None else [self.question] * len(images)
        return self.backend.p_yes(asked, list(images), normalize=self.normalize)

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del prompts, metadata
        p_yes = self.p_yes(outputs)
        value = 1 - p_yes
        applicable = torch.isfinite(value)
        return RewardOutput({self.name: value, "p_yes": p_yes}, {self.name: applicable})


__all__ = ["DEFAULT_QUESTION", "ArtifactJudgeReward"]
