"""DINOv2 rewards from reference images (Adv-GRPO: Mao et al. 2025, "The Image as Its Own
Reward", arXiv 2511.20256).

* ``dino_similarity``: cosine similarity of a sample's DINOv2 CLS embedding to the reference
  images of its prompt, the max (default) or mean over references.
* ``dino_adversarial``: a small head (Linear-GELU-Linear) on frozen DINOv2 features scores the
  CLS token and ``num_patches`` randomly sampled patch tokens; the reward is
  ``cls_weight * head(CLS) + (1 - cls_weight) * mean(head(patches))`` (0.7 / 64 patches, as
  Adv-GRPO). The head is a
  discriminator trained with the hinge loss ``relu(1 - D(real)) + relu(1 + D(fake))``, real =
  reference images, fake = the current samples: ``update(...)``, which the trainer calls every
  iteration after scoring, takes one or more Adam steps. Its weights, optimizer state and
  random state are part of the run's checkpoints.

References are a folder of images (used for every prompt) or a JSON file mapping each prompt to
a list of image paths (relative to the file). The backbone is any transformers DINOv2 checkpoint
(``facebook/dinov2-small|base|large``), loaded through ``AutoModel``; images are preprocessed in
torch with the checkpoint's own processor settings (``reward_models/vision.py``).
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
from reward_models.base import RewardModel, RewardOutput, local_hint
from reward_models.vision import ImagePreprocess

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
ALL_PROMPTS = ""  # key of references that apply to every prompt


class DinoBackbone:
    """A frozen DINOv2 model: ``features(images) -> (cls [B, D], patches [B, P, D])``."""

    def __init__(self, model: str, device: str | torch.device, dtype: str, batch_size: int) -> None:
        self.model_id = model
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.batch_size = batch_size
        self._loaded: tuple[Any, ImagePreprocess] | None = None

    def load(self) -> tuple[Any, ImagePreprocess]:
        if self._loaded is None:
            from transformers import AutoImageProcessor, AutoModel

            require_local_or_reachable(self.model_id, local_hint("model"))
            try:
                model = AutoModel.from_pretrained(self.model_id, dtype=self.dtype)
                processor = AutoImageProcessor.from_pretrained(self.model_id)
            except OSError as err:
                first = (str(err).strip().splitlines() or [repr(err)])[0]
                raise ValueError(f"cannot load DINOv2 {self.model_id!r}: {first}") from err
            model = model.to(self.device).eval().requires_grad_(False)
            self._loaded = (model, ImagePreprocess.from_image_processor(processor))
        return self._loaded

    @property
    def hidden_size(self) -> int:
        return int(self.load()[0].config.hidden_size)

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        model, preprocess = self.load()
        cls_parts, patch_parts = [], []
        for start in range(0, images.shape[0], self.batch_size):
            pixels = preprocess(images[start : start + self.batch_size], self.device)
            hidden = model(pixel_values=pixels.to(model.dtype)).last_hidden_state.float()
            # DINOv2's pooled output is the final-layernormed CLS token (hidden state 0); any
            # register tokens sit between it and the patches.
            registers = int(getattr(model.config, "num_register_tokens", 0) or 0)
            cls_parts.append(hidden[:, 0])
            patch_parts.append(hidden[:, 1 + registers :])
        return torch.cat(cls_parts), torch.cat(patch_parts)


def load_references(spec: str | Path) -> dict[str, list[Path]]:
    """``prompt -> image paths`` from a folder (key ``""``: every prompt) or a JSON mapping."""
    path = Path(spec)
    if path.is_dir():
        images = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise ValueError(
                f"reference folder {path} holds no images ({', '.join(IMAGE_SUFFIXES)})"
            )
        return {ALL_PROMPTS: images}
    if not path.is_file():
        raise FileNotFoundError(f"references {path}: no such folder or JSON file")
    try:
        mapping = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"references {path} is not JSON: {err}") from err
    if not isinstance(mapping, dict) or not all(isinstance(v, list) for v in mapping.values()):
        raise ValueError(f"references {path} must map each prompt to a list of image paths")
    references = {
        prompt: [(path.parent / p).resolve() for p in paths] for prompt, paths in mapping.items()
    }
    missing = [str(p) for paths in references.values() for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"references {path}: missing images {missing[:3]}")
    return references


def read_image(path: Path) -> torch.Tensor:
    """``[3, H, W]`` float in ``[0, 1]``."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as picture:
        array = np.asarray(picture.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255


class _ReferenceSet:
    """Reference images by prompt, read once and kept as tensors."""

    def __init__(self, spec: str | Path) -> None:
        self.paths = load_references(spec)
        self._images: dict[Path, torch.Tensor] = {}

    def for_prompt(self, prompt: str) -> list[Path]:
        return self.paths.get(prompt) or self.paths.get(ALL_PROMPTS) or []

    def images(self, paths: list[Path]) -> list[torch.Tensor]:
        for path in paths:
            if path not in self._images:
                self._images[path] = read_image(path)
        return [self._images[p] for p in paths]

    def all_paths(self) -> list[Path]:
        return sorted({p for paths in self.paths.values() for p in paths})


def _features_of(backbone: DinoBackbone, images: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Backbone features of images of any sizes (preprocessed one size at a time)."""
    cls_parts, patch_parts = [], []
    for image in images:
        cls, patches = backbone.features(image[None])
        cls_parts.append(cls)
        patch_parts.append(patches)
    return torch.cat(cls_parts), torch.cat(patch_parts)


class DinoSimilarityReward(RewardModel):
    """Cosine similarity of DINOv2 CLS embeddings to the prompt's reference images.

    Args:
        references: folder of images (all prompts) or JSON ``{prompt: [paths]}``.
        model: DINOv2 checkpoint (hub id or directory).
        reduce: ``max`` or ``mean`` over a prompt's references.
        device, dtype: where and in which precision the backbone runs.
        batch_size: images per backbone forward.

    Samples whose prompt has no references get NaN and are marked not applicable.
    """

    name = "dino_similarity"
    accepts = ("images",)

    def __init__(
        self,
        references: str,
        model: str = "facebook/dinov2-base",
        reduce: str = "max",
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        if reduce not in ("max", "mean"):
            raise ValueError(f"dino_similarity: reduce must be 'max' or 'mean', got {reduce!r}")
        self.references = _ReferenceSet(references)
        self.backbone = DinoBackbone(model, device, dtype, batch_size)
        self.reduce = reduce
        self._reference_cls: dict[Path, torch.Tensor] = {}

    def _reference_embeddings(self, paths: list[Path]) -> torch.Tensor:
        todo = [p for p in paths if p not in self._reference_cls]
        if todo:
            cls, _ = _features_of(self.backbone, self.references.images(todo))
            for path, row in zip(todo, F.normalize(cls, dim=-1), strict=True):
                self._reference_cls[path] = row
        return torch.stack([self._reference_cls[p] for p in paths])

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del metadata
        cls, _ = self.backbone.features(outputs)
        samples = F.normalize(cls, dim=-1)
        values = torch.full((len(prompts),), float("nan"))
        for prompt in dict.fromkeys(prompts):
            paths = self.references.for_prompt(prompt)
            if not paths:
                continue
            rows = [i for i, p in enumerate(prompts) if p == prompt]
            cosine = samples[rows] @ self._reference_embeddings(paths).T  # [rows, R]
            reduced = cosine.max(dim=1).values if self.reduce == "max" else cosine.mean(dim=1)
            values[rows] = reduced.cpu()
        return RewardOutput({self.name: values}, {self.name: torch.isfinite(values)})


class DinoAdversarialReward(RewardModel):
    """Adv-GRPO's adversarial DINO reward: a hinge-trained head on frozen DINOv2 tokens.

    Args:
        references: the real images: a folder, or a JSON ``{prompt: [paths]}`` (all of its images
            are reals for every sample; the discriminator learns reference vs generated).
        model: DINOv2 checkpoint.
        num_patches: patch tokens sampled per image (besides CLS) for scoring and training.
        cls_weight: weight of the CLS token's score; the patches' mean gets the rest.
        hidden: width of the head's hidden layer.
        lr: the head's Adam learning rate (betas 0.5, 0.999).
        update_steps: Adam steps per ``update`` call.
        seed: initialisation and token/reference sampling.
        device, dtype, batch_size: as for ``dino_similarity``.
    """

    name = "dino_adversarial"
    accepts = ("images",)

    def __init__(
        self,
        references: str,
        model: str = "facebook/dinov2-base",
        num_patches: int = 64,
        cls_weight: float = 0.7,
        hidden: int = 256,
        lr: float = 1e-4,
        update_steps: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        if num_patches < 0 or hidden < 1 or update_steps < 1 or lr <= 0 or not 0 <= cls_weight <= 1:
            raise ValueError(
                "dino_adversarial: need num_patches >= 0, hidden, update_steps >= 1, lr > 0"
            )
        self.references = _ReferenceSet(references)
        self.backbone = DinoBackbone(model, device, dtype, batch_size)
        self.num_patches, self.hidden, self.lr = num_patches, hidden, lr
        self.cls_weight = cls_weight
        self.update_steps, self.seed = update_steps, seed
        self.generator = torch.Generator().manual_seed(seed)
        self.updates = 0
        self._head: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None

    def _head_and_optimizer(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Built on first use (the width comes from the backbone), seeded by ``seed``."""
        if self._head is None or self._optimizer is None:
            width = self.backbone.hidden_size
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                self._head = nn.Sequential(
                    nn.Linear(width, self.hidden), nn.GELU(), nn.Linear(self.hidden, 1),
                ).to(self.backbone.device)  # fmt: skip
            # GAN-style betas, as Adv-GRPO trains its discriminator.
            self._optimizer = torch.optim.Adam(
                self._head.parameters(), lr=self.lr, betas=(0.5, 0.999)
            )
        return self._head, self._optimizer

    @property
    def head(self) -> nn.Module:
        return self._head_and_optimizer()[0]

    def tokens(
        self, images: torch.Tensor | list[torch.Tensor], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """``[B, 1 + K, D]``: the CLS token and ``K`` patch tokens drawn from ``generator``
        (default: the reward's own stream, which ``update`` advances in step on every
        process)."""
        generator = generator or self.generator
        if isinstance(images, torch.Tensor):
            cls, patches = self.backbone.features(images)
        else:
            cls, patches = _features_of(self.backbone, images)
        k = min(self.num_patches, patches.shape[1])
        picks = torch.rand(patches.shape[:2], generator=generator).argsort(dim=1)[:, :k]
        chosen = patches.gather(
            1, picks.to(patches.device)[..., None].expand(-1, -1, patches.shape[2])
        )
        return torch.cat([cls[:, None], chosen], dim=1)

    def discriminate(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[B]``: ``cls_weight`` x the CLS score + the rest x the patches' mean score."""
        scores = self.head(tokens).squeeze(-1)  # [B, 1 + K]
        if scores.shape[1] == 1:
            return scores[:, 0]
        return self.cls_weight * scores[:, 0] + (1 - self.cls_weight) * scores[:, 1:].mean(dim=1)

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del prompts, metadata
        # Scoring draws its patches from a fixed stream of its own: a score depends on the
        # images alone, and evaluation (different chunks on different processes) cannot move
        # the stream that keeps the processes' updates, hence their heads, identical.
        tokens = self.tokens(outputs, torch.Generator().manual_seed(self.seed + 104_729))
        with torch.no_grad():
            return RewardOutput({self.name: self.discriminate(tokens).cpu()})

    def update(
        self,
        outputs: Any,
        prompts: list[str],
        metadata: Any = None,
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """``update_steps`` hinge steps with the current samples as fakes and as many reference
        images (drawn from all references) as reals. With ``gather`` (several processes), every
        process trains on all processes' fakes and draws the same reals, so the heads stay equal."""
        del prompts, metadata
        fake = self.tokens(outputs)
        if gather is not None:
            fake = gather(fake)
        pool = self.references.all_paths()
        picks = torch.randint(len(pool), (fake.shape[0],), generator=self.generator).tolist()
        real = self.tokens(self.references.images([pool[i] for i in picks]))
        _, optimizer = self._head_and_optimizer()
        for _ in range(self.update_steps):
            real_score, fake_score = self.discriminate(real), self.discriminate(fake)
            loss = F.relu(1 - real_score).mean() + F.relu(1 + fake_score).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        self.updates += 1
        return {
            "d_loss": float(loss.detach()),
            "d_real": float(real_score.detach().mean()),
            "d_fake": float(fake_score.detach().mean()),
        }

    def state_dict(self) -> dict[str, Any]:
        head, optimizer = self._head_and_optimizer()
        return {
            "head": {k: v.cpu() for k, v in head.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        head, optimizer = self._head_and_optimizer()
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.updates = int(state["updates"])


__all__ = ["DinoAdversarialReward", "DinoBackbone", "DinoSimilarityReward", "load_references"]
