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

``genrl train-reward artifact`` trains a probe on a folder with ``clean/`` and ``artifact/``
image subfolders, or, by default, on the embedded synthetic set (``artifact_dataset``): digits
drawn by the embedded generator (deterministic ODE, guidance 3) as clean images, and the same
images corrupted with noise, blur, duplicated strokes or grid patterns as artifacts. Features
are computed once; the head (linear, or an MLP with ``hidden`` units) is trained full-batch with
Adam on the logistic loss over standardised features. The probe file is safetensors: head
weights, feature mean/std, and the backbone and sizes in its metadata.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.loading import require_local_or_reachable
from reward_models.base import RewardModel, RewardOutput

CORRUPTIONS = ("noise", "blur", "duplicate", "grid")
EMBEDDED_PROBE = "artifact_probe/probe.safetensors"


# -- backbones ---------------------------------------------------------------------------------
def feature_extractor(
    backbone: str, device: str | torch.device = "cpu"
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``images [B, C, H, W] in [0, 1] -> features [B, D]`` (frozen, no gradients)."""
    device = torch.device(device)
    if backbone == "digits" or backbone.startswith("digits:"):
        from pipelines.toy.models import load_classifier

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
        from reward_models.compositional import load_scorer

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
    from pipelines.toy.models import embedded_asset_path

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


# -- data ----------------------------------------------------------------------------------------
def corrupt(images: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """``images [B, C, H, W]`` in ``[0, 1]`` with one kind of artifact, drawn from ``generator``.

    noise: additive Gaussian, std ~ U(0.15, 0.35); blur: 3x3 box filter; duplicate: a copy of
    the strokes shifted by 2-3 pixels laid over the image (max); grid: every second or third row
    or column brightened by 0.4-0.8.
    """
    b, _, h, w = images.shape
    if kind == "noise":
        std = 0.15 + 0.2 * torch.rand(b, 1, 1, 1, generator=generator)
        return (images + std * torch.randn(images.shape, generator=generator)).clamp(0, 1)
    if kind == "blur":
        return F.avg_pool2d(images, 3, stride=1, padding=1, count_include_pad=False)
    if kind == "duplicate":
        out = images.clone()
        shifts = torch.randint(2, 4, (b, 2), generator=generator)
        signs = torch.randint(0, 2, (b, 2), generator=generator) * 2 - 1
        for i in range(b):
            dy, dx = (shifts[i] * signs[i]).tolist()
            out[i] = torch.maximum(images[i], torch.roll(images[i], (dy, dx), dims=(1, 2)))
        return out
    if kind == "grid":
        out = images.clone()
        periods = torch.randint(2, 4, (b,), generator=generator).tolist()
        strengths = (0.4 + 0.4 * torch.rand(b, generator=generator)).tolist()
        rows = torch.randint(0, 2, (b,), generator=generator).tolist()
        for i in range(b):
            mask = torch.zeros(h, w)
            if rows[i]:
                mask[:: periods[i]] = 1
            else:
                mask[:, :: periods[i]] = 1
            out[i] = (images[i] + strengths[i] * mask).clamp(0, 1)
        return out
    raise ValueError(f"unknown corruption {kind!r}; known: {', '.join(CORRUPTIONS)}")


def synthetic_digits(
    per_prompt: int = 16, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The embedded artifact set: ``(images [2N, 1, 8, 8], labels [2N] (1 = artifact), kinds)``.

    Clean: the embedded generator's deterministic ODE samples (10 steps, guidance 3) for every
    training prompt of the digits task; artifacts: each clean image once more, with one
    corruption (the kinds in turn).
    """
    from pipelines import build_policy
    from pipelines.toy.prompts import TRAIN_PROMPTS
    from samplers.flow_ode import integrate

    policy = build_policy("toy_digits")
    # The held-out layout of genrl's evaluation: sample i gets prompt i % P, noise from the seed.
    n = len(TRAIN_PROMPTS) * per_prompt
    order = [TRAIN_PROMPTS[i % len(TRAIN_PROMPTS)] for i in range(n)]
    noise = torch.randn((n, *policy.latent_shape), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        condition = policy.encode_prompts(order)
        latents = integrate(
            lambda x, sigma: policy.velocity(x, sigma, condition, 3.0),
            noise,
            policy.sigma_schedule(10, None),
        )
        clean = policy.decode(latents).cpu()
    generator = torch.Generator().manual_seed(seed)
    kinds = [CORRUPTIONS[i % len(CORRUPTIONS)] for i in range(len(clean))]
    corrupted = torch.empty_like(clean)
    for kind in CORRUPTIONS:
        rows = [i for i, k in enumerate(kinds) if k == kind]
        corrupted[rows] = corrupt(clean[rows], kind, generator)
    images = torch.cat([clean, corrupted])
    labels = torch.cat([torch.zeros(len(clean)), torch.ones(len(clean))])
    return images, labels, ["clean"] * len(clean) + kinds


def folder_dataset(root: str | Path) -> tuple[list[torch.Tensor], torch.Tensor, list[str]]:
    """Images of ``root/clean`` (label 0) and ``root/artifact`` (label 1)."""
    from reward_models.dino import IMAGE_SUFFIXES, read_image

    root = Path(root)
    images, labels, kinds = [], [], []
    for label, sub in ((0.0, "clean"), (1.0, "artifact")):
        folder = root / sub
        files = (
            sorted(p for p in folder.glob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
            if folder.is_dir()
            else []
        )
        if not files:
            raise ValueError(f"{folder} holds no images; expected {root}/clean and {root}/artifact")
        images += [read_image(p) for p in files]
        labels += [label] * len(files)
        kinds += [sub] * len(files)
    return images, torch.tensor(labels), kinds


# -- training ----------------------------------------------------------------------------------
def train_probe(
    features: torch.Tensor,
    labels: torch.Tensor,
    kinds: list[str],
    hidden: int = 0,
    epochs: int = 300,
    lr: float = 1e-2,
    weight_decay: float = 1e-4,
    holdout: float = 0.25,
    seed: int = 0,
) -> tuple[ArtifactProbe, dict[str, Any]]:
    """Full-batch Adam on the logistic loss; returns the probe and held-out accuracies (overall
    and per kind of image)."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(labels), generator=generator)
    cut = int(len(labels) * (1 - holdout))
    train, test = order[:cut], order[cut:]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        probe = ArtifactProbe(features.shape[1], hidden)
    probe.mean.copy_(features[train].mean(0))
    probe.std.copy_(features[train].std(0).clamp(min=1e-6))
    optimizer = torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        loss = F.binary_cross_entropy_with_logits(probe(features[train]), labels[train])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    probe.eval()
    with torch.no_grad():
        correct = (probe(features) > 0).float() == labels
    per_kind = {
        kind: round(
            float(correct[[i for i in test.tolist() if kinds[i] == kind]].float().mean()), 4
        )
        for kind in sorted(set(kinds))
        if any(kinds[i] == kind for i in test.tolist())
    }
    metrics = {
        "train_loss": round(float(loss.detach()), 5),
        "heldout_accuracy": round(float(correct[test].float().mean()), 4),
        "heldout_accuracy_by_kind": per_kind,
        "train_images": len(train),
        "heldout_images": len(test),
    }
    return probe, metrics


def train_artifact_probe(
    out: str | Path,
    data: str | None = None,
    backbone: str = "digits",
    hidden: int = 0,
    epochs: int = 300,
    seed: int = 0,
    device: str = "cpu",
) -> tuple[Path, dict[str, Any]]:
    """Train on ``data`` (a folder with clean/ and artifact/) or the embedded synthetic digits
    and write the probe file; returns its path and metrics."""
    extract = feature_extractor(backbone, device)
    if data is None:
        images, labels, kinds = synthetic_digits(seed=seed)
        features = torch.cat([extract(images[i : i + 256]) for i in range(0, len(images), 256)])
    else:
        image_list, labels, kinds = folder_dataset(data)
        features = torch.cat([extract(image[None]) for image in image_list])
    probe, metrics = train_probe(features.cpu(), labels, kinds, hidden, epochs, seed=seed)
    metrics |= {"data": data or "embedded synthetic digits", "backbone": backbone}
    return save_probe(probe, backbone, out, metrics), metrics


__all__ = [
    "CORRUPTIONS",
    "ArtifactProbe",
    "ArtifactProbeReward",
    "corrupt",
    "feature_extractor",
    "load_probe",
    "save_probe",
    "synthetic_digits",
    "train_artifact_probe",
    "train_probe",
]
