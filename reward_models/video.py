"""Video rewards built from image rewards and judges: ``frame_reward`` (any image reward on
sampled frames, aggregated per video) and ``video_judge`` (a VLM judge shown a grid of frames).

Videos are ``[B, F, C, H, W]`` floats in ``[0, 1]`` (``reward_models/base.py: OUTPUT_KINDS``).
VBench's consistency and smoothness dimensions live in ``reward_models/vbench.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from reward_models.base import RewardModel, RewardOutput
from reward_models.judge import ArtifactJudgeReward
from reward_models.vbench import check_videos

FrameSpec = str | int | list[int] | tuple[int, ...]


def frame_indices(num_frames: int, frames: FrameSpec) -> list[int]:
    """Which of ``num_frames`` frames to score.

    Args:
        frames: ``"all"``; a count ``K``: ``K`` frames evenly spaced over the clip, the first and
            the last always among them (``round(linspace(0, F - 1, K))``; ``K = 1`` is the first
            frame, ``K >= F`` all frames); or explicit indices (negative ones count from the end).
    """
    if frames == "all":
        return list(range(num_frames))
    if isinstance(frames, bool) or not isinstance(frames, int | list | tuple):
        raise ValueError(f"frames must be 'all', a count or a list of indices, got {frames!r}")
    if isinstance(frames, int):
        if frames < 1:
            raise ValueError(f"frames: the count must be >= 1, got {frames}")
        if frames >= num_frames:
            return list(range(num_frames))
        if frames == 1:
            return [0]
        return [round(i * (num_frames - 1) / (frames - 1)) for i in range(frames)]
    if not frames:
        raise ValueError("frames: the list of indices is empty")
    bad = [i for i in frames if not -num_frames <= int(i) < num_frames]
    if bad:
        raise ValueError(f"frames: indices {bad} are outside a video of {num_frames} frames")
    return [int(i) % num_frames for i in frames]


def build_inner(reward: Any, owner: str) -> RewardModel:
    """The inner reward of a wrapper: built by the registry from its spec (``nested_rewards``),
    or given built."""
    if not isinstance(reward, RewardModel):
        raise ValueError(
            f"{owner}: reward must be a built reward, or a {{'name': ..., 'kwargs': ...}} spec "
            f"given to build_reward({owner!r}, reward=...)"
        )
    return reward


class FrameReward(RewardModel):
    """An image reward on frames of each video, aggregated over the frames.

    The selected frames of all videos go to the image reward as one batch ``[B * K, C, H, W]``
    (prompts and metadata repeated per frame; cut into chunks of ``batch_size`` when given);
    its primary score comes back as ``[B, K]`` and is reduced per video.

    Args:
        reward: the image reward: a ``RewardModel``, or, through ``build_reward``, a spec
            ``{"name": "clipscore", "kwargs": {...}}`` that the registry builds.
        frames: ``"all"``, a count of evenly spaced frames (first and last included) or a list
            of indices (``frame_indices``).
        aggregate: ``"mean"`` or ``"min"`` over the frames: the primary score.
        batch_size: frames per call of the image reward (None: all in one call).
        device: handed by the registry to the image reward when its spec leaves it unset.

    Scores: ``frame_<reward>`` (the primary, e.g. ``frame_clipscore``), ``frame_mean`` and
    ``frame_min`` of the image reward's primary score over the frames (both logged whatever
    ``aggregate`` is; not ``mean``/``min``, which the trainer's ``<score>/mean`` would repeat),
    and the frame mean of each of its other scores under their names. Frames the image reward
    marks not applicable are left out of a video's aggregate; a video with no applicable frame
    gets NaN and is marked not applicable. ``update``, ``state_dict`` and ``load_state_dict``
    go to the image reward (``update`` with the selected frames as images).
    """

    accepts = ("videos",)
    nested_rewards = ("reward",)
    """Arguments that ``build_reward`` builds from specs before this class sees them."""

    def __init__(
        self,
        reward: RewardModel,
        frames: FrameSpec = "all",
        aggregate: str = "mean",
        batch_size: int | None = None,
        device: Any = "cpu",
    ) -> None:
        if aggregate not in ("mean", "min"):
            raise ValueError(f"frame_reward: aggregate must be 'mean' or 'min', got {aggregate!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"frame_reward: batch_size must be >= 1, got {batch_size}")
        del device  # used by the registry, for the image reward
        self.reward = build_inner(reward, "frame_reward")
        if "images" not in self.reward.accepts:
            raise ValueError(
                f"frame_reward: {self.reward.name!r} scores {self.reward.accepts}, not images"
            )
        frame_indices(1_000_000, frames)  # fail on a malformed spec now, not at the first call
        self.frames, self.aggregate, self.batch_size = frames, aggregate, batch_size
        self.name = f"frame_{self.reward.name}"

    def _frames(
        self, outputs: Any, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> tuple[torch.Tensor, list[str], list[dict[str, Any]] | None, int]:
        """The selected frames as images ``[B * K, C, H, W]`` (video-major), with prompts and
        metadata repeated per frame, and ``K``."""
        videos = check_videos(outputs, self.name, min_frames=1)
        picks = frame_indices(videos.shape[1], self.frames)
        k = len(picks)
        images = videos[:, picks].reshape(videos.shape[0] * k, *videos.shape[2:])
        repeated = [p for p in prompts for _ in range(k)]
        rows = [m for m in metadata for _ in range(k)] if metadata else None
        return images, repeated, rows, k

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        images, repeated, rows, k = self._frames(outputs, prompts, metadata)
        n, b = images.shape[0], len(prompts)
        step = self.batch_size or n
        scores: dict[str, list[torch.Tensor]] = {}
        applicable: dict[str, list[torch.Tensor]] = {}
        infos: list[dict[str, Any]] | None = []
        for start in range(0, n, step):
            end = min(start + step, n)
            part = self.reward(images[start:end], repeated[start:end], rows and rows[start:end])
            for key, value in part.scores.items():
                scores.setdefault(key, []).append(value.float().cpu())
                mask = part.applicable.get(key, torch.ones(end - start, dtype=torch.bool))
                applicable.setdefault(key, []).append(mask.bool().cpu())
            if infos is not None and part.info is not None:
                infos.extend(part.info)
            else:
                infos = None
        per_frame = {key: torch.cat(parts).reshape(b, k) for key, parts in scores.items()}
        masks = {key: torch.cat(parts).reshape(b, k) for key, parts in applicable.items()}

        inner = self.reward.name
        values, mask = per_frame[inner], masks[inner]
        count = mask.sum(dim=1)
        mean = torch.where(mask, values, 0).sum(dim=1) / count  # NaN where no frame applies
        low = torch.where(mask, values, math.inf).min(dim=1).values
        low = torch.where(count > 0, low, math.nan)
        primary = mean if self.aggregate == "mean" else low
        out = {self.name: primary, "frame_mean": mean, "frame_min": low}
        for key, value in per_frame.items():
            if key != inner:
                # An image reward's extra named like one of ours keeps its value under a prefix.
                name = key if key not in out else f"frame_{key}"
                m = masks[key]
                out[name] = torch.where(m, value, 0).sum(dim=1) / m.sum(dim=1)
        info = None
        if infos is not None and len(infos) == n:
            info = [{"frames": infos[i * k : (i + 1) * k]} for i in range(b)]
        return RewardOutput(out, {self.name: count > 0}, info)

    def update(
        self,
        outputs: Any,
        prompts: list[str],
        metadata: Any = None,
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """The image reward's ``update`` on the selected frames (as ``[B * K]`` images)."""
        images, repeated, rows, _ = self._frames(outputs, prompts, metadata)
        return self.reward.update(images, repeated, rows, gather)

    def state_dict(self) -> dict[str, Any]:
        return self.reward.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reward.load_state_dict(state)


def tile_frames(frames: torch.Tensor, columns: int) -> torch.Tensor:
    """``[B, K, C, H, W]`` -> one grid image per video ``[B, C, rows * H, columns * W]``, frames
    in reading order (left to right, top to bottom), unused cells black."""
    b, k, c, h, w = frames.shape
    rows = math.ceil(k / columns)
    cells = frames.new_zeros(b, rows * columns, c, h, w)
    cells[:, :k] = frames
    grid = cells.reshape(b, rows, columns, c, h, w).permute(0, 3, 1, 4, 2, 5)
    return grid.reshape(b, c, rows * h, columns * w)


DEFAULT_VIDEO_QUESTION = (
    "These are {frames} frames of one video, in order from left to right and top to bottom. "
    "Is it a natural, temporally consistent video of: {prompt}? Answer Yes or No."
)


class VideoJudgeReward(ArtifactJudgeReward):
    """A VLM judge (``artifact_judge``'s machinery: a local transformers VLM or an
    OpenAI-compatible endpoint, P(yes) from the answer token) shown ``frames`` frames of a
    video tiled into one grid image.

    One image per question works with every VLM the artifact judge supports (several images
    per prompt need each model's own multi-image conventions); the price is resolution: a
    2 x 2 grid at the judge's input size gives each frame a quarter of it.

    Args:
        frames: which frames, as ``frame_reward``'s ``frames`` (default 4 evenly spaced).
        columns: grid columns (default ``ceil(sqrt(K))``).
        question: ``{prompt}`` is replaced by the sample's prompt, ``{frames}`` by ``K``.
        reward_answer: ``"yes"`` scores ``P(yes)`` (the question asks for a good property),
            ``"no"`` scores ``1 - P(yes)`` (it asks for a fault, as ``artifact_judge``).
        The rest as ``artifact_judge``.

    Scores: ``video_judge`` and ``p_yes`` ``[B]``; NaN (not applicable) where the judge names
    neither answer.
    """

    name = "video_judge"
    accepts = ("videos",)

    def __init__(
        self,
        model: str | None = None,
        endpoint: str | None = None,
        frames: FrameSpec = 4,
        columns: int | None = None,
        question: str = DEFAULT_VIDEO_QUESTION,
        reward_answer: str = "yes",
        device: str | torch.device = "cpu",
        **judge: Any,
    ) -> None:
        if reward_answer not in ("yes", "no"):
            raise ValueError(
                f"video_judge: reward_answer must be 'yes' or 'no', got {reward_answer!r}"
            )
        if columns is not None and columns < 1:
            raise ValueError(f"video_judge: columns must be >= 1, got {columns}")
        # ``device`` is named here so that the trainer hands a local judge its accelerator.
        super().__init__(model=model, endpoint=endpoint, question=question, device=device, **judge)
        frame_indices(1_000_000, frames)
        self.frames, self.columns, self.reward_answer = frames, columns, reward_answer

    def grids(self, videos: torch.Tensor) -> torch.Tensor:
        """``[B, F, C, H, W]`` -> the grid images shown to the judge ``[B, C, H', W']``."""
        picks = frame_indices(videos.shape[1], self.frames)
        columns = self.columns or math.ceil(math.sqrt(len(picks)))
        return tile_frames(videos[:, picks], min(columns, len(picks)))

    def questions(self, prompts: list[str], num_frames: int) -> list[str]:
        k = len(frame_indices(num_frames, self.frames))
        return [self.question.replace("{prompt}", p).replace("{frames}", str(k)) for p in prompts]

    def score(
        self, outputs: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        del metadata
        videos = check_videos(outputs, self.name, min_frames=1)
        grids = self.grids(videos)
        questions = self.questions(prompts, videos.shape[1])
        p_yes = self.p_yes(grids, questions)
        value = p_yes if self.reward_answer == "yes" else 1 - p_yes
        return RewardOutput({self.name: value, "p_yes": p_yes}, {self.name: torch.isfinite(value)})


__all__ = ["FrameReward", "VideoJudgeReward", "frame_indices", "tile_frames"]
