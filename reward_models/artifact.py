"""Artifact probe: a small head on frozen image features that predicts "this image has
artifacts"; the reward is ``1 - P(artifact)``.

Backbones (``backbone`` of the probe file):

* ``digits``: the embedded digit classifier's hidden layer and the 64 pixels of ``[B, 1, 8, 8]``
  images (no extra dependency), the regulariser of the embedded task;
* ``compositional`` (or ``compositional:<scorer file>``): the compositional task's cell
  scorer's hidden features of the four cells and the ``[3, 8, 8]`` average-pooled pixels of
  ``[B, 3, 32, 32]`` canvases;
* ``dino:<checkpoint>``: a DINOv2 CLS embedding (transformers);
* ``clip:<checkpoint>``: a CLIP image embedding (transformers).

``genrl train-reward artifact`` trains a probe (``genrl/cli/train_reward.py``) on a folder with
``clean/`` and ``artifact/`` image subfolders, or, by default, on the embedded synthetic set.
The probe file is safetensors: head weights, feature mean/std, and the backbone and sizes in
its metadata.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from loading.hub import require_local_or_reachable
from reward_models.base import RewardModel, RewardOutput

EMBEDDED_PROBE = "artifact_probe/probe.safetensors"


# -- backbones ---------------------------------------------------------------------------------
def feature_extractor(
    backbone: str, device: str | torch.device = "cpu"
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``images [B, C, H, W] in [0, 1] -> features [B, D]`` (frozen, no gradients)."""
    device = torch.device(device)
    if backbone == "digits" or backbone.startswith("digits:"):
        from tasks.digits import load_classifier

        path = backbone.partition(":")[2] or None
        classifier = load_classifier(path).to(device).eval()

        @torch.no_grad()
        def digits(images: torch.Tensor) -> torch.Tensor:
            if images.shape[1] == 3:
                images = images.mean(dim=1, keepdim=True)
            x = images.to(device, torch.float32)
            h = F.relu(classifier.conv1(x))
            h = F.max_pool2d(F.relu(classifier.conv2(h)), 2)
            # The classifier was trained to ignore noise, so the pixels themselves join its
            # hidden features (an 8x8 image is only 64 numbers).
            return torch.cat([F.relu(classifier.fc1(h.flatten(1))), x.flatten(1)], dim=1)

        return digits
    if backbone == "compositional" or backbone.startswith("compositional:"):
        from tasks.compositional_scorer import load_scorer

        scorer = load_scorer(backbone.partition(":")[2] or None).to(device)

        @torch.no_grad()
        def compositional(images: torch.Tensor) -> torch.Tensor:
            x = images.to(device, torch.float32)
            # The scorer's cell features, and the pixels at a quarter of the resolution.
            cells = scorer.features(x).flatten(1)
            return torch.cat([cells, F.avg_pool2d(x, 4).flatten(1)], dim=1)

        return compositional
    kind, _, checkpoint = backbone.partition(":")
    if kind == "dino" and checkpoint:
        from reward_models.dino import DinoBackbone

        dino = DinoBackbone(checkpoint, device, "float32", batch_size=32)
        return lambda images: dino.features(images)[0]
    if kind == "clip" and checkpoint:
        return _clip_features(checkpoint, device)
    raise ValueError(
        f"unknown artifact-probe backbone {backbone!r}: use digits, compositional, "
        "dino:<checkpoint> or clip:<checkpoint>"
    )


def _clip_features(checkpoint: str, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    from transformers import CLIPImageProcessor, CLIPModel

    from reward_models.clip import projected_embedding
    from reward_models.vision import ImagePreprocess

    require_local_or_reachable(checkpoint, "--backbone clip:DIR")
    model = CLIPModel.from_pretrained(checkpoint).to(device).eval().requires_grad_(False)  # type: ignore[arg-type]
    preprocess = ImagePreprocess.from_image_processor(
        CLIPImageProcessor.from_pretrained(checkpoint)
    )

    @torch.no_grad()
    def clip(images: torch.Tensor) -> torch.Tensor:
        pixels = preprocess(images, device)
        return projected_embedding(model.get_image_features(pixel_values=pixels)).float()

    return clip


# -- the probe -----------------------------------------------------------------------------------
class ArtifactProbe(nn.Module):
    """Standardised features -> logit of P(artifact): linear (``hidden=0``) or a one-hidden-layer
    MLP."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, feature_dim: int, hidden: int = 0) -> None:
        super().__init__()
        self.feature_dim, self.hidden = feature_dim, hidden
        self.register_buffer("mean", torch.zeros(feature_dim))
        self.register_buffer("std", torch.ones(feature_dim))
        if hidden:
            self.net: nn.Module = nn.Sequential(
                nn.Linear(feature_dim, hidden), nn.GELU(), nn.Linear(hidden, 1)
            )
        else:
            self.net = nn.Linear(feature_dim, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net((features - self.mean) / self.std).squeeze(-1)


def save_probe(
    probe: ArtifactProbe, backbone: str, path: str | Path, metrics: dict[str, Any]
) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().float().contiguous() for k, v in probe.state_dict().items()}
    config = {"backbone": backbone, "feature_dim": probe.feature_dim, "hidden": probe.hidden}
    # One metadata key of sorted JSON: safetensors does not keep the order of several keys,
    # and the embedded probe must rebuild byte for byte.
    text = json.dumps({"config": config, "metrics": metrics}, sort_keys=True)
    save_file(tensors, str(path), metadata={"artifact_probe": text})
    return path


def load_probe(path: str | Path) -> tuple[ArtifactProbe, str, dict[str, Any]]:
    """``(probe, backbone, metrics)`` from a probe file."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"artifact probe {path} not found (train one: genrl train-reward artifact)"
        )
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if "artifact_probe" not in metadata:
        raise ValueError(f"{path} is not an artifact probe (no artifact_probe metadata)")
    meta = json.loads(metadata["artifact_probe"])
    config = meta["config"]
    probe = ArtifactProbe(config["feature_dim"], config["hidden"])
    probe.load_state_dict(load_file(str(path)))
    return probe.eval(), config["backbone"], meta["metrics"]


def embedded_probe_path() -> Path:
    from loading.assets import embedded_asset_path

    return embedded_asset_path(EMBEDDED_PROBE)


class ArtifactProbeReward(RewardModel):
    """``artifact_probe = 1 - P(artifact)`` from a trained probe; also logs
    ``artifact_probability``.

    Args:
        path: probe file; None = the embedded probe of the digits task.
        device: where the backbone and the head run.
    """

    name = "artifact_probe"
    accepts = ("images",)

    def __init__(self, path: str | None = None, device: str | torch.device = "cpu") -> None:
        self.path = Path(path) if path else embedded_probe_path()
        self.device = torch.device(device)
        self._loaded: tuple[ArtifactProbe, Callable[[torch.Tensor], torch.Tensor]] | None = None

    def _load(self) -> tuple[ArtifactProbe, Callable[[torch.Tensor], torch.Tensor]]:
        if self._loaded is None:
            probe, backbone, _ = load_probe(self.path)
            self._loaded = (probe.to(self.device), feature_extractor(backbone, self.device))
        return self._loaded

    @torch.no_grad()
    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del prompts, metadata
        probe, features = self._load()
        probability = torch.sigmoid(probe(features(outputs))).cpu()
        return RewardOutput({self.name: 1 - probability, "artifact_probability": probability})


__all__ = [
    "ArtifactProbe",
    "ArtifactProbeReward",
    "feature_extractor",
    "load_probe",
    "save_probe",
]
