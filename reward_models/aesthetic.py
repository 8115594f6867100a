"""LAION aesthetic predictor v2 ("improved aesthetic predictor", C. Schuhmann, LAION 2022): an
MLP on the L2-normalised CLIP ViT-L/14 image embedding that predicts a 1-10 rating.

The embedding comes from transformers' ``openai/clip-vit-large-patch14`` (the OpenAI ViT-L/14
that the predictor was trained on; no open_clip needed), preprocessed in torch
(``reward_models/vision.py``), so scoring is batched and differentiable. The head is the
``sac+logos+ava1-l14-linearMSE.pth`` state dict of the predictor's repository (``head``: a local
file or URL; default: that repository's file, downloaded once into torch's hub cache).
Layer sizes 768 -> 1024 -> 128 -> 64 -> 16 -> 1 with dropout 0.2 / 0.2 / 0.1 (inactive here)
and no activations, as in the original ``MLP`` class, so the state dict keys are
``layers.{0,2,4,6,7}.{weight,bias}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from loading.hub import require_local_or_reachable
from reward_models.base import RewardModel, RewardOutput, local_hint
from reward_models.clip import projected_embedding
from reward_models.vision import ImagePreprocess

HEAD_URL = (
    "https://github.com/christophschuhmann/improved-aesthetic-predictor/raw/main/"
    "sac%2Blogos%2Bava1-l14-linearMSE.pth"
)


class AestheticMLP(nn.Module):
    """The predictor's head; ``embedding_dim`` is 768 for ViT-L/14."""

    def __init__(self, embedding_dim: int = 768) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(embedding_dim, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        return self.layers(embedding).squeeze(-1)


def load_head(head: str | None, embedding_dim: int) -> AestheticMLP:
    """The head from a local file, a URL, or (None) the predictor repository's file."""
    source = head or HEAD_URL
    if source.startswith(("http://", "https://")):
        state = torch.hub.load_state_dict_from_url(source, map_location="cpu", weights_only=True)
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"aesthetic head {path} not found")
        state = torch.load(path, map_location="cpu", weights_only=True)
    mlp = AestheticMLP(embedding_dim)
    try:
        mlp.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(
            f"aesthetic head {source}: not a {embedding_dim}-input predictor state dict "
            f"({str(err).splitlines()[0]})"
        ) from err
    return mlp.eval()


class AestheticReward(RewardModel):
    """``aesthetic``: the predicted 1-10 rating of each image.

    Args:
        model: CLIP checkpoint whose image embedding the head reads (ViT-L/14).
        head: the predictor's state dict (file or URL); None = the repository's file.
        device, dtype: where and in which precision CLIP runs (the head runs in float32).
    """

    name = "aesthetic"
    accepts = ("images",)

    def __init__(
        self,
        model: str = "openai/clip-vit-large-patch14",
        head: str | None = None,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
    ) -> None:
        self.model_id, self.head_source = model, head
        self.device, self.dtype = torch.device(device), getattr(torch, dtype)
        self._loaded: tuple[Any, ImagePreprocess, AestheticMLP] | None = None

    def _load(self) -> tuple[Any, ImagePreprocess, AestheticMLP]:
        if self._loaded is None:
            from transformers import CLIPImageProcessor, CLIPModel

            require_local_or_reachable(self.model_id, local_hint("model"))
            try:
                clip = CLIPModel.from_pretrained(self.model_id, dtype=self.dtype)
                processor = CLIPImageProcessor.from_pretrained(self.model_id)
            except OSError as err:
                first = (str(err).strip().splitlines() or [repr(err)])[0]
                raise ValueError(f"aesthetic: cannot load CLIP {self.model_id!r}: {first}") from err
            clip = clip.to(self.device).eval().requires_grad_(False)  # type: ignore[arg-type]
            head = load_head(self.head_source, clip.config.projection_dim).to(self.device)
            head.requires_grad_(False)
            self._loaded = (clip, ImagePreprocess.from_image_processor(processor), head)
        return self._loaded

    def differentiable(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """``[B]`` ratings with gradients w.r.t. ``images`` (reward-gradient methods)."""
        del prompts
        clip, preprocess, head = self._load()
        pixels = preprocess(images, self.device).to(clip.dtype)
        embedding = projected_embedding(clip.get_image_features(pixel_values=pixels)).float()
        return head(F.normalize(embedding, dim=-1))

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del metadata
        with torch.no_grad():
            return RewardOutput({self.name: self.differentiable(outputs, prompts).cpu()})


__all__ = ["AestheticMLP", "AestheticReward", "load_head"]
