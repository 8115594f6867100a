"""The one judge back-end of genrl's VLM/LLM judges (``artifact_judge``, ``vqa_score``,
``video_judge`` and the rubric's judge and extractor criteria): many (question, optional image)
items answered in batched calls.

Two jobs:

* ``p_yes``: the first answer token's ``P(yes) / (P(yes) + P(no))`` (or ``P(yes)`` over the
  whole vocabulary with ``normalize=False``), where ``P(yes)`` sums the probabilities of the
  "yes" spellings ("Yes", "yes", with and without a leading space) and likewise for "no";
  NaN (not applicable) when the judge names neither;
* ``generate``: a short greedy answer, for LLM extractors ("extract the final answer").

Local back-end: a transformers checkpoint, loaded as the policies load theirs
(``loading/transformers_checkpoint.py``): a VLM (``AutoModelForImageTextToText`` with its
processor) when its config has a ``vision_config``, else a text LLM (``AutoModelForCausalLM``
with its tokenizer). Items are grouped by whether they carry an image and answered
``batch_size`` at a time in one forward each, left-padded. A text LLM gets position ids from
the attention mask, so a padded row reads what it reads alone; a VLM is left to compute its own
(Qwen's multimodal RoPE places the vision tokens itself, and RoPE is unaffected by the constant
shift left padding adds). Endpoint back-end: an OpenAI-compatible chat API; every item is one request, ``concurrency`` of them in flight. ``calls`` counts forwards
(local) or requests (endpoint), which ``benchmarks/rubric.py`` reports.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from loading.transformers_checkpoint import (
    CheckpointHints,
    is_vision_language,
    load_causal_lm,
    load_vision_language_model,
    torch_dtype,
)
from reward_models.base import local_hint
from reward_models.composite import RewardError
from reward_models.remote import post_json
from reward_models.wire import encode_outputs, quantize

# How a judge's trust_remote_code is spelled in loading errors (a reward's kwargs, or the
# rubric's judge table).
JUDGE_REMOTE_CODE = "trust_remote_code=true in the judge's settings"


def as_image_tensor(image: Any) -> torch.Tensor:
    """``[C, H, W]`` float in ``[0, 1]`` from such a tensor or a PIL image."""
    if isinstance(image, torch.Tensor):
        return image.float()
    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1)


class JudgeBackend:
    """Batched yes/no probabilities and short answers from a local model or an endpoint.

    Args:
        model: local transformers checkpoint (hub id or directory); or
        endpoint: base URL of an OpenAI-compatible API such as ``http://host:8000/v1`` (vLLM,
            SGLang or a hosted API); exactly one of the two.
        endpoint_model: the model name the endpoint expects.
        yes_words, no_words: the answers' spellings (case and a leading space are added).
        api_key_env: environment variable holding the endpoint's key (if any).
        device, dtype, batch_size: the local model's placement (``dtype`` by name: "float32",
            "bfloat16" or "float16", as a policy's) and batching.
        trust_remote_code: allow a local checkpoint's own code (off by default).
        top_logprobs, timeout_s, retries, concurrency: endpoint settings (requests run
            concurrently; failures are retried with backoff).
        max_new_tokens: the longest extraction ``generate`` returns.
        owner: the reward named in errors.
    """

    def __init__(
        self,
        model: str | None = None,
        endpoint: str | None = None,
        endpoint_model: str = "default",
        yes_words: tuple[str, ...] | list[str] = ("yes",),
        no_words: tuple[str, ...] | list[str] = ("no",),
        api_key_env: str = "OPENAI_API_KEY",
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        batch_size: int = 16,
        trust_remote_code: bool = False,
        top_logprobs: int = 20,
        timeout_s: float = 120.0,
        retries: int = 3,
        concurrency: int = 8,
        max_new_tokens: int = 16,
        owner: str = "rubric",
    ) -> None:
        if (model is None) == (endpoint is None):
            raise ValueError(f"{owner}: give the judge exactly one of model (local) or endpoint")
        self.model_id, self.endpoint = model, endpoint.rstrip("/") if endpoint else None
        self.endpoint_model, self.owner = endpoint_model, owner
        self.yes_words = [w.lower() for w in yes_words]
        self.no_words = [w.lower() for w in no_words]
        self.api_key = os.environ.get(api_key_env)
        torch_dtype(dtype)  # a bad name fails here, not at the first score
        self.device, self.dtype = torch.device(device), dtype
        self.batch_size, self.trust_remote_code = batch_size, trust_remote_code
        self.top_logprobs, self.timeout_s = top_logprobs, timeout_s
        self.retries, self.concurrency = retries, concurrency
        self.max_new_tokens = max_new_tokens
        self.calls = 0
        self._local: tuple[Any, Any, bool, list[int], list[int]] | None = None

    # -- local -------------------------------------------------------------------------------
    def _load(self) -> tuple[Any, Any, bool, list[int], list[int]]:
        """(model, processor or tokenizer, is_vlm, yes ids, no ids), loaded once."""
        if self._local is None:
            assert self.model_id is not None
            # The policies' loader (left padding: answers are read at the last column).
            hints = CheckpointHints(local_hint("judge"), JUDGE_REMOTE_CODE)
            remote = self.trust_remote_code
            try:
                vlm = is_vision_language(self.model_id, remote, hints, "judge")
                load = load_vision_language_model if vlm else load_causal_lm
                model, processor = load(self.model_id, self.dtype, remote, hints, "judge")
            except ValueError as err:
                raise ValueError(f"{self.owner}: {err}") from err
            tokenizer = processor.tokenizer if vlm else processor
            model = model.to(self.device).eval().requires_grad_(False)
            yes = answer_token_ids(tokenizer, self.yes_words)
            no = answer_token_ids(tokenizer, self.no_words)
            if not yes or not no:
                raise ValueError(
                    f"{self.owner}: the judge tokenizer has no single token for "
                    f"{self.yes_words} or {self.no_words}"
                )
            self._local = (model, processor, vlm, yes, no)
        return self._local

    def _inputs(self, questions: list[str], images: list[Any | None]) -> Any:
        """Tokenised chat prompts (with pixel values when the items carry images)."""
        from PIL import Image

        _, processor, vlm, _, _ = self._load()
        texts = []
        for question, image in zip(questions, images, strict=True):
            if vlm:
                content = [{"type": "image"}] if image is not None else []
                content.append({"type": "text", "text": question})
                chat = [{"role": "user", "content": content}]
            else:
                chat = [{"role": "user", "content": question}]
            if getattr(processor, "chat_template", None):
                texts.append(
                    processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
                )
            else:
                texts.append(question)
        kwargs: dict[str, Any] = {"text": texts, "return_tensors": "pt", "padding": True}
        if any(image is not None for image in images):
            pixels = quantize(torch.stack([as_image_tensor(i) for i in images]))
            arrays = pixels.permute(0, 2, 3, 1).numpy()
            kwargs["images"] = [
                Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a).convert("RGB") for a in arrays
            ]
        return processor(**kwargs).to(self.device)

    def _chunks(self, images: list[Any | None]) -> list[list[int]]:
        """Item indices in chunks of ``batch_size`` that either all carry an image or none do."""
        chunks: list[list[int]] = []
        for with_image in (False, True):
            idx = [i for i, image in enumerate(images) if (image is not None) == with_image]
            chunks += [idx[s : s + self.batch_size] for s in range(0, len(idx), self.batch_size)]
        return chunks

    @torch.no_grad()
    def _local_p_yes(
        self, questions: list[str], images: list[Any | None], normalize: bool
    ) -> torch.Tensor:
        model, _, vlm, yes, no = self._load()
        out = torch.full((len(questions),), float("nan"))
        for chunk in self._chunks(images):
            inputs = self._inputs([questions[i] for i in chunk], [images[i] for i in chunk])
            if not vlm:
                inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            logits = model(**inputs).logits[:, -1].float()
            self.calls += 1
            probs = logits.softmax(dim=-1)
            p_yes, p_no = probs[:, yes].sum(dim=1), probs[:, no].sum(dim=1)
            out[chunk] = (p_yes / (p_yes + p_no) if normalize else p_yes).cpu()
        return out

    @torch.no_grad()
    def _local_generate(self, questions: list[str], images: list[Any | None]) -> list[str]:
        model, processor, _, _, _ = self._load()
        tokenizer = getattr(processor, "tokenizer", processor)
        out = [""] * len(questions)
        for chunk in self._chunks(images):
            inputs = self._inputs([questions[i] for i in chunk], [images[i] for i in chunk])
            tokens = model.generate(
                **inputs, max_new_tokens=self.max_new_tokens, do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
            self.calls += 1
            new = tokens[:, inputs["input_ids"].shape[1] :]
            for i, text in zip(
                chunk, tokenizer.batch_decode(new, skip_special_tokens=True), strict=True
            ):
                out[i] = text.strip()
        return out

    # -- endpoint ----------------------------------------------------------------------------
    def _request(self, question: str, image: Any | None, answer_tokens: int) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if image is not None:
            png = encode_outputs(as_image_tensor(image)[None])["images"][0]
            content.append(
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
            )
        content.append({"type": "text", "text": question})
        body: dict[str, Any] = {
            "model": self.endpoint_model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": answer_tokens,
            "temperature": 0,
        }
        if answer_tokens == 1:
            body.update(logprobs=True, top_logprobs=self.top_logprobs)
        self.calls += 1
        return post_json(
            f"{self.endpoint}/chat/completions", body, self.api_key, self.timeout_s,
            self.retries, backoff_s=1.0,
            token_hint="set the key's environment variable with api_key_env",
        )  # fmt: skip

    def _ask_p_yes(self, question: str, image: Any | None, normalize: bool) -> float:
        reply = self._request(question, image, 1)
        return p_yes_from_reply(
            reply, self.yes_words, self.no_words, self.owner, self.endpoint, normalize
        )

    def _ask_text(self, question: str, image: Any | None) -> str:
        reply = self._request(question, image, self.max_new_tokens)
        try:
            return str(reply["choices"][0]["message"]["content"] or "").strip()
        except (KeyError, IndexError, TypeError) as err:
            raise RewardError(
                f"{self.owner}: {self.endpoint} returned no message ({err!r})"
            ) from err

    # -- public ------------------------------------------------------------------------------
    def p_yes(
        self,
        questions: list[str],
        images: list[Any | None] | None = None,
        normalize: bool = True,
    ) -> torch.Tensor:
        """``[N]`` P(yes) of ``N`` questions, each with its image or None: normalised over the
        two answers (NaN where the answer names neither word), or over the vocabulary."""
        images = images if images is not None else [None] * len(questions)
        if not questions:
            return torch.zeros(0)
        if self.endpoint is None:
            return self._local_p_yes(questions, images, normalize)
        with ThreadPoolExecutor(self.concurrency) as pool:
            values = list(pool.map(self._ask_p_yes, questions, images, [normalize] * len(images)))
        return torch.tensor(values, dtype=torch.float32)

    def generate(self, questions: list[str], images: list[Any | None] | None = None) -> list[str]:
        """Short greedy answers to ``N`` questions (``max_new_tokens`` at most)."""
        images = images if images is not None else [None] * len(questions)
        if not questions:
            return []
        if self.endpoint is None:
            return self._local_generate(questions, images)
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(self._ask_text, questions, images))


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


__all__ = ["JudgeBackend", "answer_token_ids", "as_image_tensor", "p_yes_from_reply"]
