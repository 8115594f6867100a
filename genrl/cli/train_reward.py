"""``genrl train-reward artifact``: the data and training of an artifact probe
(``reward_models/artifact.py`` holds the probe and its reward).

The default data is the embedded synthetic set: digits drawn by the embedded generator
(deterministic ODE, guidance 3) as clean images, and the same images corrupted with noise, blur,
duplicated strokes or grid patterns as artifacts. It lives here, above both the adapters and the
rewards, because drawing it needs a policy (``pipelines``) and the probe is a reward.
Features are computed once; the head (linear, or an MLP with ``hidden`` units) is trained
full-batch with Adam on the logistic loss over standardised features.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from reward_models.artifact import ArtifactProbe, feature_extractor, save_probe

CORRUPTIONS = ("noise", "blur", "duplicate", "grid")
"""The kinds of artifact ``corrupt`` draws, in the order the synthetic set cycles through."""


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
    from samplers.flow_ode import integrate
    from tasks.digits import TRAIN_PROMPTS

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
