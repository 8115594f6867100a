"""CLIP-embedding rewards through transformers: CLIPScore and PickScore.

Both embed the image and the prompt with a CLIP model and score their cosine similarity; they
differ in the checkpoint and the scale:

* CLIPScore (Hessel et al. 2021, eq. 1): ``w * max(cos(E_image, E_text), 0)`` with ``w = 2.5``,
  on ``openai/clip-vit-large-patch14`` by default.
* PickScore (Kirstain et al. 2023, "Pick-a-Pic", section 4): ``logit_scale.exp() * cos`` of the
  ``yuvalkirstain/PickScore_v1`` CLIP ViT-H-14, divided by 26 as Flow-GRPO does so that rewards
  sit near 0.8-0.9.

Images are preprocessed in torch (``reward_models/vision.py``: bicubic resize of the short side,
centre crop, CLIP normalisation) rather than through the PIL image processor: batched, on the
model's device and differentiable, for reward-gradient methods. The projected embedding is read in both the
transformers 4.x (a tensor) and 5.x (an output object with ``pooler_output``) conventions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from loading.hub import require_local_or_reachable
from reward_models.base import RewardModel, RewardOutput, local_hint
from reward_models.vision import ImagePreprocess


def projected_embedding(output: Any) -> torch.Tensor:
    """``get_image_features``/``get_text_features`` result as a ``[B, D]`` tensor: transformers 5
    returns an output object whose ``pooler_output`` holds the projection, 4.x the tensor."""
    if isinstance(output, torch.Tensor):
        return output
    return output.pooler_output


class CLIPSimilarityReward(RewardModel):
    """``scale * f(cos(image, prompt))``, batched; subclasses fix the checkpoint and ``f``.

    Args:
        model: hub id or local directory of a transformers ``CLIPModel``.
        processor: where the tokenizer and image-processor settings live; None = ``model``.
        device: where to run the model.
        dtype: model dtype (``float32``, ``bfloat16`` or ``float16``).
    """

    name = "clip_similarity"
    accepts = ("images",)
    image_channels = (3,)  # CLIP's processor normalises RGB
    default_model = ""
    default_processor: str | None = None

    def __init__(
        self,
        model: str | None = None,
        processor: str | None = None,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
    ) -> None:
        self.model_id = model or self.default_model
        # A custom model brings its own processor files unless told otherwise.
        default_processor = self.default_processor if model is None else None
        self.processor_id = processor or default_processor or self.model_id
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self._loaded: tuple[Any, Any, ImagePreprocess] | None = None

    def _load(self) -> tuple[Any, Any, ImagePreprocess]:
        if self._loaded is None:
            from transformers import CLIPImageProcessor, CLIPModel, CLIPTokenizer

            require_local_or_reachable(self.model_id, local_hint("model"))
            require_local_or_reachable(self.processor_id, local_hint("processor"))
            try:
                model = CLIPModel.from_pretrained(self.model_id, dtype=self.dtype)
                tokenizer = CLIPTokenizer.from_pretrained(self.processor_id)
                image_processor = CLIPImageProcessor.from_pretrained(self.processor_id)
            except OSError as err:
                raise ValueError(
                    f"reward {self.name!r}: cannot load {self.model_id!r} / "
                    f"{self.processor_id!r}: {str(err).strip().splitlines()[0]}"
                ) from err
            model = model.to(self.device).eval().requires_grad_(False)  # type: ignore[arg-type]
            self._loaded = (model, tokenizer, ImagePreprocess.from_image_processor(image_processor))
        return self._loaded

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` in ``[0, 1]`` -> normalised CLIP input (differentiable)."""
        return self._load()[2](images, self.device)

    def cosine(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """``[B]`` cosine similarity of each image with its prompt (differentiable in images)."""
        model, tokenizer, _ = self._load()
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(
                f"{self.name}: expected RGB images [B, 3, H, W] in [0, 1], "
                f"got {tuple(images.shape)}"
            )
        distinct = list(dict.fromkeys(prompts))  # groups repeat prompts: encode each once
        tokens = tokenizer(
            distinct, padding=True, truncation=True, max_length=77, return_tensors="pt"
        ).to(self.device)
        with torch.no_grad():
            text = projected_embedding(model.get_text_features(**tokens)).float()
        text = F.normalize(text, dim=-1)[[distinct.index(p) for p in prompts]]
        pixels = self.preprocess(images).to(model.dtype)
        image = F.normalize(
            projected_embedding(model.get_image_features(pixel_values=pixels)).float(), dim=-1
        )
        return (image * text).sum(dim=-1)

    def transform(self, cosine: torch.Tensor) -> torch.Tensor:
        return cosine

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del metadata
        with torch.no_grad():
            cosine = self.cosine(outputs, prompts)
        return RewardOutput({self.name: self.transform(cosine).cpu(), "clip_cosine": cosine.cpu()})

    def differentiable(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """The reward with gradients w.r.t. ``images`` (for reward-gradient methods)."""
        return self.transform(self.cosine(images, prompts))


class CLIPScoreReward(CLIPSimilarityReward):
    """CLIPScore ``w * max(cos, 0)`` (Hessel et al. 2021), ``w = 2.5``."""

    name = "clipscore"
    default_model = "openai/clip-vit-large-patch14"

    def __init__(
        self,
        model: str | None = None,
        processor: str | None = None,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        weight: float = 2.5,
    ) -> None:
        super().__init__(model, processor, device, dtype)
        self.weight = weight

    def transform(self, cosine: torch.Tensor) -> torch.Tensor:
        return self.weight * cosine.clamp(min=0)


class PickScoreReward(CLIPSimilarityReward):
    """PickScore ``logit_scale.exp() * cos / normalizer`` (Kirstain et al. 2023; Flow-GRPO
    divides by 26)."""

    name = "pickscore"
    default_model = "yuvalkirstain/PickScore_v1"
    default_processor = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"

    def __init__(
        self,
        model: str | None = None,
        processor: str | None = None,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        normalizer: float = 26.0,
    ) -> None:
        super().__init__(model, processor, device, dtype)
        self.normalizer = normalizer

    def transform(self, cosine: torch.Tensor) -> torch.Tensor:
        model, _, _ = self._load()
        return model.logit_scale.exp().float().to(cosine.device) * cosine / self.normalizer
