"""VBench's temporal-quality dimensions as video rewards (Huang et al. 2024, "VBench:
Comprehensive Benchmark Suite for Video Generative Models", arXiv 2311.17982), re-implemented from
the released code (github.com/Vchitect/VBench, read at commit 45e79ec).

* ``subject_consistency`` (``vbench/subject_consistency.py: subject_consistency``): DINO ViT-B/16
  CLS features of every frame (``facebook/dino-vitb16`` here; VBench loads the same weights
  through ``torch.hub`` as ``dino_vitb16``).
* ``background_consistency`` (``vbench/background_consistency.py: background_consistency``):
  CLIP ViT-B/32 projected image embeddings (``openai/clip-vit-base-patch32`` here; VBench uses
  OpenAI's ``clip`` package, ``ViT-B/32``).

Both score a video ``[F, C, H, W]`` with unit features ``f_0 .. f_{F-1}`` as

    s = 1 / (F - 1) * sum_{i=1}^{F-1} (max(0, <f_{i-1}, f_i>) + max(0, <f_0, f_i>)) / 2,

VBench's per-video ``video_results`` (the benchmark's own summary number divides the sum over all
videos by the number of frame pairs, which weights long videos more; a reward is per video).

Preprocessing follows VBench's path for video files (``read_frame=False``; ``vbench/utils.py``):
frames as float values, short side resized to 224 without antialiasing (``dino_transform``:
bilinear, no crop, the DINO ViT interpolates its position embeddings to the frame's aspect;
``clip_transform``: bicubic, then a 224 centre crop), ImageNet resp. CLIP normalisation.

* ``motion_smoothness`` (``vbench/motion_smoothness.py: MotionSmoothness.motion_score``): VBench
  keeps the even frames ``0, 2, 4, ...``, interpolates the midpoint of each consecutive pair with
  AMT-S (a learned frame interpolator) and compares each prediction with the odd frame it
  replaces: ``(255 - mean |frame - prediction|) / 255`` on 8-bit frames (``vfi_score``,
  ``get_diff``: ``cv2.absdiff`` averaged over pixels and channels, then over frames). AMT's
  weights are not loadable here, so the default interpolator is a documented **stand-in**: the
  average of the two neighbours (exact for a linear fade, blind to motion). The scoring formula,
  the frame selection and the 8-bit quantisation (inputs rounded, predictions truncated as AMT's
  ``tensor2img`` does) are VBench's; ``interpolator`` takes any other callable.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from reward_models.base import RewardModel, RewardOutput

# vbench/utils.py: dino_transform and clip_transform normalise with these constants.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

FeatureFn = Callable[[torch.Tensor], torch.Tensor]
Interpolator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_videos(videos: Any, name: str, min_frames: int) -> torch.Tensor:
    """``videos`` as a float ``[B, F, C, H, W]`` tensor with at least ``min_frames`` frames."""
    if not isinstance(videos, torch.Tensor) or videos.ndim != 5:
        shape = tuple(videos.shape) if isinstance(videos, torch.Tensor) else type(videos)
        raise ValueError(f"{name}: expected videos [B, F, C, H, W] in [0, 1], got {shape}")
    if videos.shape[1] < min_frames:
        raise ValueError(
            f"{name}: needs videos of at least {min_frames} frames, got {videos.shape[1]}"
        )
    return videos


def consistency(features: torch.Tensor) -> dict[str, torch.Tensor]:
    """VBench's frame-consistency score of each video from per-frame features.

    Args:
        features: ``[B, F, D]`` (any scale; rows are L2-normalised here), ``F >= 2``.

    Returns:
        ``score`` ``[B]``: mean over ``i = 1 .. F-1`` of ``(max(0, cos(f_{i-1}, f_i)) +
        max(0, cos(f_0, f_i))) / 2`` (``vbench/subject_consistency.py: subject_consistency``,
        identical in ``background_consistency.py``); ``previous`` and ``first``: the means of
        the two clamped cosines alone ``[B]``.
    """
    unit = F.normalize(features.float(), dim=-1)
    previous = (unit[:, 1:] * unit[:, :-1]).sum(dim=-1).clamp(min=0)  # [B, F-1]
    first = (unit[:, 1:] * unit[:, :1]).sum(dim=-1).clamp(min=0)  # [B, F-1]
    return {
        "score": ((previous + first) / 2).mean(dim=1),
        "previous": previous.mean(dim=1),
        "first": first.mean(dim=1),
    }


def resize_short_side(images: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """``[N, C, H, W]`` -> short side ``size``, long side ``int(size * long / short)``, as
    torchvision's ``Resize(size, antialias=False)`` on a tensor (the long side truncated, no
    antialiasing: VBench resizes video frames this way)."""
    h, w = images.shape[-2:]
    target = (size, int(size * w / h)) if h <= w else (int(size * h / w), size)
    if target == (h, w):
        return images
    return F.interpolate(images, size=target, mode=mode, align_corners=False, antialias=False)


def center_crop(images: torch.Tensor, size: int) -> torch.Tensor:
    """A ``size x size`` centre crop, offsets rounded as torchvision's ``CenterCrop``."""
    h, w = images.shape[-2:]
    top, left = round((h - size) / 2.0), round((w - size) / 2.0)
    return images[..., top : top + size, left : left + size]


def normalize(
    images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]
) -> torch.Tensor:
    if images.shape[1] == 1:  # grayscale frames: the backbones take RGB
        images = images.expand(-1, 3, -1, -1)
    m = torch.tensor(mean, device=images.device).view(1, 3, 1, 1)
    s = torch.tensor(std, device=images.device).view(1, 3, 1, 1)
    return (images - m) / s


class FeatureConsistency(RewardModel):
    """VBench's consistency formula (``consistency``) over any per-frame feature extractor.

    Args:
        features: ``[N, C, H, W]`` frames in ``[0, 1]`` -> ``[N, D]`` features; subclasses
            override ``frame_features`` instead.
        name: the primary score's name.
        batch_size: frames per ``features`` call; all frames of all videos are flattened into
            one sequence and cut into chunks of this size.

    Scores: ``<name>`` ``[B]`` and the means of the two terms, ``previous`` and ``first``.
    """

    name = "feature_consistency"
    accepts = ("videos",)

    def __init__(
        self, features: FeatureFn | None = None, name: str | None = None, batch_size: int = 32
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"{self.name}: batch_size must be >= 1, got {batch_size}")
        self._features = features
        self.name = name or self.name
        self.batch_size = batch_size

    def frame_features(self, frames: torch.Tensor) -> torch.Tensor:
        """``[N, C, H, W]`` in ``[0, 1]`` -> ``[N, D]``."""
        if self._features is None:
            raise ValueError(
                f"{self.name}: give features=fn ([N, C, H, W] frames -> [N, D]) or use "
                "subject_consistency / background_consistency"
            )
        return self._features(frames)

    @torch.no_grad()
    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del prompts, metadata
        videos = check_videos(outputs, self.name, min_frames=2)
        b, f = videos.shape[:2]
        flat = videos.reshape(b * f, *videos.shape[2:])
        features = torch.cat(
            [
                self.frame_features(flat[start : start + self.batch_size]).float().cpu()
                for start in range(0, b * f, self.batch_size)
            ]
        )
        parts = consistency(features.reshape(b, f, -1))
        return RewardOutput(
            {self.name: parts["score"], "previous": parts["previous"], "first": parts["first"]}
        )


class SubjectConsistency(FeatureConsistency):
    """VBench's subject consistency: the consistency formula on DINO CLS features.

    Args:
        model: a transformers DINO checkpoint loaded through ``AutoModel`` (VBench's weights are
            DINO ViT-B/16 v1: ``facebook/dino-vitb16``; a DINOv2 checkpoint works too).
        size: short side of the resized frames (VBench: 224; no crop).
        device, dtype, batch_size: where and in which precision the backbone runs; frames per
            forward.

    The feature is the final-layernormed CLS token, what the ``torch.hub`` DINO model returns.
    Position embeddings are interpolated to the frame's aspect (transformers' bicubic
    interpolation, which differs from DINO's own in the scale offset: features agree to
    interpolation error, not bit for bit).
    """

    name = "subject_consistency"

    def __init__(
        self,
        model: str = "facebook/dino-vitb16",
        size: int = 224,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        from reward_models.dino import DinoBackbone

        super().__init__(batch_size=batch_size)
        self.size = size
        self.backbone = DinoBackbone(model, device, dtype, batch_size)
        self._interpolate: bool | None = None

    def frame_features(self, frames: torch.Tensor) -> torch.Tensor:
        model, _ = self.backbone.load()
        if self._interpolate is None:
            # ViT (DINO v1) interpolates position embeddings only when asked; DINOv2 always does.
            self._interpolate = (
                "interpolate_pos_encoding" in inspect.signature(model.forward).parameters
            )
        pixels = frames.to(self.backbone.device, torch.float32)
        pixels = normalize(
            resize_short_side(pixels, self.size, "bilinear"), IMAGENET_MEAN, IMAGENET_STD
        )
        extra = {"interpolate_pos_encoding": True} if self._interpolate else {}
        hidden = model(pixel_values=pixels.to(model.dtype), **extra).last_hidden_state
        return hidden[:, 0].float()


class BackgroundConsistency(FeatureConsistency):
    """VBench's background consistency: the consistency formula on CLIP image embeddings.

    Args:
        model: a transformers ``CLIPModel`` checkpoint (VBench: ViT-B/32,
            ``openai/clip-vit-base-patch32``).
        size: resize of the short side and centre crop (VBench: 224).
        device, dtype, batch_size: as for ``subject_consistency``.
    """

    name = "background_consistency"

    def __init__(
        self,
        model: str = "openai/clip-vit-base-patch32",
        size: int = 224,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        batch_size: int = 32,
    ) -> None:
        super().__init__(batch_size=batch_size)
        self.model_id, self.size = model, size
        self.device, self.dtype = torch.device(device), getattr(torch, dtype)
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            from transformers import CLIPModel

            from loading.hub import require_local_or_reachable
            from reward_models.base import local_hint

            require_local_or_reachable(self.model_id, local_hint("model"))
            try:
                model = CLIPModel.from_pretrained(self.model_id, dtype=self.dtype)
            except OSError as err:
                first = (str(err).strip().splitlines() or [repr(err)])[0]
                raise ValueError(f"{self.name}: cannot load {self.model_id!r}: {first}") from err
            self._model = model.to(self.device).eval().requires_grad_(False)  # type: ignore[arg-type]
        return self._model

    def frame_features(self, frames: torch.Tensor) -> torch.Tensor:
        from reward_models.clip import projected_embedding

        model = self._load()
        pixels = resize_short_side(frames.to(self.device, torch.float32), self.size, "bicubic")
        # No clamp after the bicubic overshoot: VBench resizes float frames (torch.Tensor of
        # the decoded uint8 array) and divides by 255 afterwards.
        pixels = normalize(center_crop(pixels, self.size), CLIP_MEAN, CLIP_STD)
        output = model.get_image_features(pixel_values=pixels.to(model.dtype))
        return projected_embedding(output).float()


def average_interpolator(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """The stand-in for AMT: the midpoint frame as the mean of its neighbours ``[N, C, H, W]``."""
    return (before + after) / 2


def _resolve_interpolator(interpolator: str | Interpolator) -> Interpolator:
    if callable(interpolator):
        return interpolator
    if interpolator == "average":
        return average_interpolator
    if ":" in interpolator:  # "package.module:function", for configs
        module, attr = interpolator.split(":", 1)
        resolved = getattr(importlib.import_module(module), attr)
        if not callable(resolved):
            raise ValueError(f"motion_smoothness: {interpolator!r} is not callable")
        return resolved
    raise ValueError(
        f"motion_smoothness: interpolator must be 'average', 'module:function' or a callable, "
        f"got {interpolator!r}"
    )


class MotionSmoothness(RewardModel):
    """VBench's motion smoothness with a pluggable frame interpolator (default: a stand-in).

    For each video ``[F, C, H, W]`` (``F >= 3``): keep frames ``0, 2, 4, ...``; predict the
    midpoint of each consecutive kept pair; compare prediction ``k`` with frame ``2k + 1``:

        motion_smoothness = 1 - mean |frame_{2k+1} - prediction_k|   (in [0, 1] units),

    i.e. VBench's ``(255 - vfi_score) / 255`` (``vbench/motion_smoothness.py:
    MotionSmoothness.motion_score`` and ``vfi_score``). With an even ``F`` the last odd frame has
    no prediction and is skipped, as in VBench.

    Args:
        interpolator: ``(before [N, C, H, W], after [N, C, H, W]) -> midpoint [N, C, H, W]`` in
            ``[0, 1]``; ``"average"`` (default) is the stand-in for VBench's AMT-S: the mean of
            the two neighbours. It is exact for a linear brightness ramp and penalises any
            motion (a moving object becomes a double exposure), so it measures temporal
            smoothness of pixel values, not of motion as a learned interpolator does.
            ``"module:function"`` imports one.
        quantize: score 8-bit frames as VBench does (frames rounded to ``k / 255``, predictions
            truncated, AMT's ``tensor2img``); off compares the float frames.
        batch_size: frame pairs per interpolator call (all pairs of all videos are flattened).
    """

    name = "motion_smoothness"
    accepts = ("videos",)

    def __init__(
        self,
        interpolator: str | Interpolator = "average",
        quantize: bool = True,
        batch_size: int = 64,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"{self.name}: batch_size must be >= 1, got {batch_size}")
        self.interpolator = _resolve_interpolator(interpolator)
        self.quantize, self.batch_size = quantize, batch_size

    @torch.no_grad()
    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del prompts, metadata
        videos = check_videos(outputs, self.name, min_frames=3).float()
        if self.quantize:  # VBench reads 8-bit frames from the video file
            videos = (videos.clamp(0, 1) * 255).round() / 255
        kept = videos[:, 0::2]  # [B, ceil(F/2), C, H, W]
        pairs = kept.shape[1] - 1
        targets = videos[:, 1::2][:, :pairs]  # [B, pairs, C, H, W]
        b, shape = videos.shape[0], videos.shape[2:]
        before = kept[:, :-1].reshape(b * pairs, *shape)
        after = kept[:, 1:].reshape(b * pairs, *shape)
        predicted = torch.cat(
            [
                self.interpolator(
                    before[start : start + self.batch_size], after[start : start + self.batch_size]
                ).float()
                for start in range(0, b * pairs, self.batch_size)
            ]
        ).reshape(b, pairs, *shape)
        if self.quantize:
            # tensor2img: (x * 255).clip(0, 255).astype(uint8) truncates; the 1e-3 keeps a
            # prediction that is an exact level in exact arithmetic (11.99999 in float32) on it.
            predicted = (predicted.to(videos.device) * 255 + 1e-3).clamp(0, 255).floor() / 255
        error = (targets - predicted.to(videos.device)).abs().mean(dim=(1, 2, 3, 4))
        return RewardOutput({self.name: (1 - error).cpu(), "interpolation_error": error.cpu()})


__all__ = [
    "BackgroundConsistency",
    "FeatureConsistency",
    "MotionSmoothness",
    "SubjectConsistency",
    "average_interpolator",
    "consistency",
]
