"""Artifact reward in its VLM-judge form: ask a vision-language model whether an image has
artifacts and read the answer from one token's probabilities,

    artifact_judge = 1 - P(yes) / (P(yes) + P(no)),

where ``P(yes)`` sums the next-token probabilities of the answer's "yes" spellings ("Yes",
"yes", with and without a leading space) and likewise for "no". Normalising over the two
answers removes the mass a model puts on other tokens; a judge that names neither gets NaN
(not applicable).

Two back-ends with the same question (``question``):

* a local transformers VLM (``model``: any ``AutoModelForImageTextToText`` checkpoint with a chat
  template, e.g. Qwen2.5-VL or LLaVA): one batched forward, last position's logits;
* an OpenAI-compatible endpoint (``endpoint``: base URL such as ``http://host:8000/v1``, served
  by vLLM, SGLang or a hosted API): one chat completion per image with ``max_tokens=1``,
  ``logprobs`` and ``top_logprobs``; requests run concurrently, failures are retried.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from pipelines.loading import require_local_or_reachable
from reward_models.base import RewardModel, RewardOutput, local_hint
from reward_models.composite import RewardError
from reward_models.remote import post_json
from reward_models.wire import encode_outputs, quantize

DEFAULT_QUESTION = (
    "Does this image contain visual artifacts, such as distorted or extra limbs, garbled text, "
    "noise, blur or duplicated objects? Answer Yes or No."
)


class ArtifactJudgeReward(RewardModel):
    """``1 - P(yes)`` of a VLM asked whether the image has artifacts.

    Args:
        model: local transformers VLM checkpoint (hub id or directory); or
        endpoint: base URL of an OpenAI-compatible API (exactly one of the two).
        endpoint_model: the model name the endpoint expects.
        question: what the judge is asked.
        yes_words, no_words: the answers' spellings (case and a leading space are added).
        api_key_env: environment variable holding the endpoint's key (if any).
        device, dtype, batch_size: the local model's placement and batching.
        trust_remote_code: allow a local checkpoint's own code (off by default).
        top_logprobs, timeout_s, retries, concurrency: endpoint settings.
    """

    name = "artifact_judge"
    accepts = ("images",)
    normalize = True
    """Report ``P(yes) / (P(yes) + P(no))`` (True) or ``P(yes)`` over the whole vocabulary."""

    def __init__(
        self,
        model: str | None = None,
        endpoint: str | None = None,
        endpoint_model: str = "default",
        question: str = DEFAULT_QUESTION,
        yes_words: tuple[str, ...] | list[str] = ("yes",),
        no_words: tuple[str, ...] | list[str] = ("no",),
        api_key_env: str = "OPENAI_API_KEY",
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        batch_size: int = 8,
        trust_remote_code: bool = False,
        top_logprobs: int = 20,
        timeout_s: float = 120.0,
        retries: int = 3,
        concurrency: int = 8,
    ) -> None:
        if (model is None) == (endpoint is None):
            raise ValueError(f"{self.name}: give exactly one of model (local) or endpoint (URL)")
        self.model_id, self.endpoint = model, endpoint.rstrip("/") if endpoint else None
        self.endpoint_model, self.question = endpoint_model, question
        self.yes_words = [w.lower() for w in yes_words]
        self.no_words = [w.lower() for w in no_words]
        self.api_key = os.environ.get(api_key_env)
        self.device, self.dtype = torch.device(device), getattr(torch, dtype)
        self.batch_size, self.trust_remote_code = batch_size, trust_remote_code
        self.top_logprobs, self.timeout_s = top_logprobs, timeout_s
        self.retries, self.concurrency = retries, concurrency
        self._local: tuple[Any, Any, list[int], list[int]] | None = None

    # -- local VLM ---------------------------------------------------------------------------
    def _load(self) -> tuple[Any, Any, list[int], list[int]]:
        if self._local is None:
            from transformers import AutoModelForImageTextToText, AutoProcessor

            assert self.model_id is not None
            require_local_or_reachable(self.model_id, local_hint("model"))
            try:
                processor = AutoProcessor.from_pretrained(
                    self.model_id, trust_remote_code=self.trust_remote_code
                )
                model = AutoModelForImageTextToText.from_pretrained(
                    self.model_id, dtype=self.dtype, trust_remote_code=self.trust_remote_code
                )
            except (OSError, ValueError) as err:
                first = (str(err).strip().splitlines() or [repr(err)])[0]
                raise ValueError(f"{self.name}: cannot load {self.model_id!r}: {first}") from err
            processor.tokenizer.padding_side = "left"  # the answer is read at the last column
            model = model.to(self.device).eval().requires_grad_(False)  # type: ignore[arg-type]
            yes = self._token_ids(processor.tokenizer, self.yes_words)
            no = self._token_ids(processor.tokenizer, self.no_words)
            if not yes or not no:
                raise ValueError(
                    f"{self.name}: the tokenizer has no single token for {self.yes_words} "
                    f"or {self.no_words}"
                )
            self._local = (model, processor, yes, no)
        return self._local

    @staticmethod
    def _token_ids(tokenizer: Any, words: list[str]) -> list[int]:
        return answer_token_ids(tokenizer, words)

    @torch.no_grad()
    def _local_p_yes(
        self, images: torch.Tensor, questions: list[str] | None = None
    ) -> torch.Tensor:
        """``[B]`` P(yes) for ``[B, C, H, W]`` images, each asked ``questions[i]`` (default:
        ``question``)."""
        from PIL import Image

        model, processor, yes, no = self._load()
        texts = {}
        for question in dict.fromkeys(questions or [self.question]):
            messages = [
                {
                    "role": "user",
                    "content": [{"type": "image"}, {"type": "text", "text": question}],
                }
            ]
            texts[question] = processor.apply_chat_template(messages, add_generation_prompt=True)
        asked = questions or [self.question] * len(images)
        pixels = quantize(images).permute(0, 2, 3, 1).numpy()
        values = []
        for start in range(0, len(pixels), self.batch_size):
            chunk = [
                Image.fromarray(p[..., 0] if p.shape[-1] == 1 else p).convert("RGB")
                for p in pixels[start : start + self.batch_size]
            ]
            text = [texts[q] for q in asked[start : start + self.batch_size]]
            inputs = processor(images=chunk, text=text, return_tensors="pt", padding=True).to(
                self.device
            )
            logits = model(**inputs).logits[:, -1].float()
            probs = logits.softmax(dim=-1)
            p_yes, p_no = probs[:, yes].sum(dim=1), probs[:, no].sum(dim=1)
            values.append((p_yes / (p_yes + p_no) if self.normalize else p_yes).cpu())
        return torch.cat(values)

    # -- endpoint ----------------------------------------------------------------------------
    def _endpoint_p_yes(
        self, images: torch.Tensor, questions: list[str] | None = None
    ) -> torch.Tensor:
        pngs = encode_outputs(images)["images"]
        asked = questions or [self.question] * len(pngs)
        with ThreadPoolExecutor(self.concurrency) as pool:
            return torch.tensor(list(pool.map(self._ask, pngs, asked)), dtype=torch.float32)

    def _ask(self, png: str, question: str | None = None) -> float:
        body = {
            "model": self.endpoint_model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                        {"type": "text", "text": question or self.question},
                    ],
                }
            ],
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": self.top_logprobs,
        }
        reply = post_json(
            f"{self.endpoint}/chat/completions",
            body,
            self.api_key,
            self.timeout_s,
            self.retries,
            backoff_s=1.0,
            token_hint="set the key's environment variable with api_key_env",
        )
        return p_yes_from_reply(
            reply, self.yes_words, self.no_words, self.name, self.endpoint, self.normalize
        )

    # -- reward ------------------------------------------------------------------------------
    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del prompts, metadata
        if self.endpoint is not None:
            p_yes = self._endpoint_p_yes(outputs)
        else:
            p_yes = self._local_p_yes(outputs)
        value = 1 - p_yes
        applicable = torch.isfinite(value)
        return RewardOutput({self.name: value, "p_yes": p_yes}, {self.name: applicable})


def answer_token_ids(tokenizer: Any, words: list[str]) -> list[int]:
    """Single-token spellings of ``words``: as given, capitalised, with a leading space."""
    ids: set[int] = set()
    for word in words:
        for spelling in {word, word.capitalize(), " " + word, " " + word.capitalize()}:
            encoded = tokenizer.encode(spelling, add_special_tokens=False)
            if len(encoded) == 1:
                ids.add(int(encoded[0]))
    return sorted(ids)


def p_yes_from_reply(
    reply: dict[str, Any],
    yes_words: list[str],
    no_words: list[str],
    owner: str,
    url: Any,
    normalize: bool = True,
) -> float:
    """``P(yes) / (P(yes) + P(no))`` (or ``P(yes)`` itself without ``normalize``) from an
    OpenAI-compatible chat reply's ``top_logprobs`` of the first answer token (NaN when it
    names neither); ``RewardError`` naming ``owner`` and ``url`` when the reply has no
    log-probabilities."""
    try:
        candidates = reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        mass = {"yes": 0.0, "no": 0.0}
        for candidate in candidates:
            word = str(candidate["token"]).strip().lower()
            if word in yes_words:
                mass["yes"] += math.exp(float(candidate["logprob"]))
            elif word in no_words:
                mass["no"] += math.exp(float(candidate["logprob"]))
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise RewardError(
            f"{owner}: {url} returned no top_logprobs for the answer token "
            f"({err!r}); the server must support logprobs"
        ) from err
    if not normalize:
        return mass["yes"]
    total = mass["yes"] + mass["no"]
    return mass["yes"] / total if total > 0 else math.nan


__all__ = ["DEFAULT_QUESTION", "ArtifactJudgeReward", "answer_token_ids", "p_yes_from_reply"]
