"""OCR reward: does the image show the text the prompt quotes?

Flow-GRPO's text-rendering task (Liu et al., "Flow-GRPO", 2025; ``flow_grpo/ocr.py``,
``OcrScorer``; ``config/grpo.py`` ``general_ocr_*`` with ``reward_fn={"ocr": 1.0}``) scores an
image by reading it and comparing the transcription with the text between the prompt's first
pair of double quotes (``prompt.split('"')[1]``):

* spaces are removed and both strings lower-cased;
* distance 0 when the target is a substring of the transcription, else the Levenshtein distance;
* the distance is capped at the target's length ("recognized many unrelated characters, only add
  one character penalty" per character of the target);
* reward ``1 - distance / len(target)``, in ``[0, 1]``.

verl-omni's Qwen-Image OCR reward (``verl_omni/utils/reward_score/genrm_ocr.py``,
``_levenshtein_score``) is the same rule with every whitespace removed (``\\s+``) and an empty
target scored 1 for an empty transcription, 0 otherwise (Flow-GRPO divides by zero there); this
module follows those two choices.

The reader differs: Flow-GRPO runs PaddleOCR (text detection + recognition, lines
concatenated), verl-omni asks a VLM (Qwen3-VL-8B-Instruct) for the text. PaddleOCR is outside
genrl's stack; here the reader is any transformers ``VisionEncoderDecoderModel`` loaded with
``from_pretrained`` (default ``microsoft/trocr-base-printed``, TrOCR: Li et al., 2021), decoded
greedily in batches. TrOCR reads one text line from the whole image, so on scenes with small or
several text regions it under-reads compared with PaddleOCR's detector; a fine-tuned or
scene-text TrOCR checkpoint (``model=``) is the lever, or a VLM reader behind ``remote``.
"""

from __future__ import annotations

from typing import Any

import torch

from loading.hub import require_local_or_reachable
from reward_models.base import RewardModel, RewardOutput, local_hint


def quoted_text(prompt: str) -> str:
    """The text between the prompt's first pair of double quotes (Flow-GRPO's
    ``prompt.split('"')[1]``; verl-omni's data script extracts its ground truth the same way)."""
    parts = str(prompt).split('"')
    if len(parts) < 3:
        raise ValueError(f'ocr reward: prompt {str(prompt)!r} quotes no text ("...")')
    return parts[1]


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions of one character each)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def ocr_score(recognized: str, target: str) -> float:
    """``1 - min(d, len(t)) / len(t)`` with ``d = 0`` when the target ``t`` occurs in the
    transcription, else their edit distance; whitespace removed, lower-cased (module
    docstring)."""
    text = "".join(recognized.split()).lower()
    goal = "".join(target.split()).lower()
    if not goal:
        return 1.0 if not text else 0.0
    distance = 0 if goal in text else min(levenshtein(text, goal), len(goal))
    return 1.0 - distance / len(goal)


class OCRReward(RewardModel):
    """``ocr``: how well an OCR model's reading of each image matches the prompt's quoted text.

    Args:
        model: a ``VisionEncoderDecoderModel`` checkpoint (hub id or directory) with its image
            processor and tokenizer.
        max_new_tokens: longest transcription read, in tokens.
        device, dtype: where and in which precision the reader runs.

    The target is ``metadata[i]["ocr_text"]`` when a dataset row carries one, else the prompt's
    quoted text. ``info`` holds each transcription.
    """

    name = "ocr"
    accepts = ("images",)

    def __init__(
        self,
        model: str = "microsoft/trocr-base-printed",
        max_new_tokens: int = 32,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"ocr reward: max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model_id, self.max_new_tokens = model, max_new_tokens
        self.device, self.dtype = torch.device(device), getattr(torch, dtype)
        self._loaded: tuple[Any, Any, Any] | None = None

    def _load(self) -> tuple[Any, Any, Any]:
        if self._loaded is None:
            from transformers import AutoImageProcessor, AutoTokenizer, VisionEncoderDecoderModel

            require_local_or_reachable(self.model_id, local_hint("model"))
            try:
                reader = VisionEncoderDecoderModel.from_pretrained(self.model_id, dtype=self.dtype)
                processor = AutoImageProcessor.from_pretrained(self.model_id)
                tokenizer = AutoTokenizer.from_pretrained(self.model_id)
            except OSError as err:
                first = (str(err).strip().splitlines() or [repr(err)])[0]
                raise ValueError(f"ocr: cannot load {self.model_id!r}: {first}") from err
            reader = reader.to(self.device).eval().requires_grad_(False)  # type: ignore[arg-type]
            self._loaded = (reader, processor, tokenizer)
        return self._loaded

    @torch.no_grad()
    def read(self, images: torch.Tensor) -> list[str]:
        """Transcriptions of images ``[B, 3, H, W]`` in ``[0, 1]``, greedy decoding."""
        reader, processor, tokenizer = self._load()
        # 8-bit RGB as Flow-GRPO hands its reader (round, clamp, uint8, HWC).
        pixels = (images.float() * 255).round().clamp(0, 255).to(torch.uint8)
        arrays = list(pixels.permute(0, 2, 3, 1).cpu().numpy())
        inputs = processor(images=arrays, return_tensors="pt")
        values = inputs["pixel_values"].to(self.device, reader.dtype)
        ids = reader.generate(
            pixel_values=values, max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1
        )
        return [str(t) for t in tokenizer.batch_decode(ids, skip_special_tokens=True)]

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        rows = metadata or [{} for _ in prompts]
        targets = [
            str(row["ocr_text"]) if "ocr_text" in row else quoted_text(prompt)
            for prompt, row in zip(prompts, rows, strict=True)
        ]
        texts = self.read(outputs)
        scores = [ocr_score(text, target) for text, target in zip(texts, targets, strict=True)]
        info = [{"ocr_text": text, "target": t} for text, t in zip(texts, targets, strict=True)]
        return RewardOutput({self.name: torch.tensor(scores, dtype=torch.float32)}, info=info)


__all__ = ["OCRReward", "levenshtein", "ocr_score", "quoted_text"]
