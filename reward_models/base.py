"""The reward-model contract (docs/rewards.md).

A reward model is called on a batch of decoded outputs with their prompts and returns named score
vectors. Its *primary* score (the one named like the reward) is what training uses; other scores
are logged. Plain Python callables with TRL's signature are accepted through ``CallableReward``.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# What a reward can be called on, named as the wire format names them (``reward_models/wire.py``):
# images ``[B, C, H, W]`` in ``[0, 1]``, videos ``[B, F, C, H, W]`` in ``[0, 1]`` (F frames), or a
# list of texts.
OUTPUT_KINDS: tuple[str, ...] = ("images", "videos", "texts")


class RewardInputError(ValueError):
    """What the caller sent cannot be scored by this reward: a prompt it cannot parse, an image
    of a size or channel count it does not take. The message is one line about the input (a
    reward server sends it to the client with a 422), never about the reward's own state; any
    other exception a reward raises is its own fault (a server answers 500 and logs it)."""


def output_kind(outputs: Any) -> str:
    """The ``OUTPUT_KINDS`` name of a batch of outputs: a 4-D tensor holds images, a 5-D one
    videos, a list texts."""
    if isinstance(outputs, torch.Tensor):
        if outputs.ndim == 4:
            return "images"
        if outputs.ndim == 5:
            return "videos"
        raise ValueError(
            "outputs must be images [B, C, H, W] or videos [B, F, C, H, W], "
            f"got a tensor of shape {tuple(outputs.shape)}"
        )
    return "texts"


@dataclass
class RewardOutput:
    """Scores of one batch.

    Attributes:
        scores: name -> ``[B]`` float32 tensor. NaN marks "not applicable" for that sample only
            when the reward says so through ``applicable``.
        applicable: name -> ``[B]`` bool; missing means applicable everywhere.
        info: optional per-sample extras (e.g. a judge's text), ``B`` dicts.
    """

    scores: dict[str, torch.Tensor]
    applicable: dict[str, torch.Tensor] = field(default_factory=dict)
    info: list[dict[str, Any]] | None = None


class RewardModel(abc.ABC):
    """Base class. Subclasses set ``name`` and implement ``score``; loading is lazy (first call).

    ``accepts`` names the output kinds (of ``OUTPUT_KINDS``) the reward can score, so that a reward
    server refuses a request of another kind with a 400 before the model sees it. The default,
    every kind, suits rewards that look only at prompts or metadata; image and text rewards
    narrow it.
    """

    name: str = "reward"
    accepts: tuple[str, ...] = OUTPUT_KINDS
    concurrent_calls: int = 1
    """Calls of this reward that may run at once, each from its own thread, when chunks are
    scored while the next ones sample (``train.overlap_rewards``). 1, the default, scores
    chunks one after the other in one background thread, which is safe for a model holding a
    device or state; a client of a remote server may allow several requests in flight."""
    image_channels: tuple[int, ...] | None = None
    """Channel counts of the images (or video frames) the reward scores: 1 grayscale, 3 RGB;
    None takes either. Checked by ``__call__`` and, from the PNG headers before decoding, by a
    reward server."""
    image_size: tuple[int, int] | None = None
    """(height, width) the reward scores, for rewards of one fixed input size; None: any size
    (the reward resizes)."""
    # The primary score's [low, high] when the reward guarantees one (a probability, a
    # fraction); plots clip the mean ± std band to it. None: unbounded or unknown.
    score_range: tuple[float, float] | None = None
    headline: str | None = None
    """The score (a key of ``score``'s output besides the primary one) in which the task's
    results are stated, e.g. Countdown's ``accuracy``, when it is not the primary score (which
    training maximises, and may shape with partial credit). A run's closing line and
    ``report.html`` show it next to the reward; None: the primary score is the headline."""

    def __call__(
        self,
        outputs: Any,
        prompts: Sequence[str],
        metadata: Sequence[dict[str, Any]] | None = None,
    ) -> RewardOutput:
        if len(prompts) != _batch_len(outputs):
            raise RewardInputError(
                f"reward {self.name!r}: {_batch_len(outputs)} outputs but {len(prompts)} prompts"
            )
        kind = output_kind(outputs)
        if kind not in self.accepts:
            hint = (
                " (score videos with an image reward through reward_models.video.FrameReward)"
                if kind == "videos" and "images" in self.accepts
                else ""
            )
            raise RewardInputError(
                f"reward {self.name!r} scores {' or '.join(self.accepts)}, got {kind}{hint}"
            )
        if kind != "texts":
            channels, height, width = outputs.shape[-3:]
            self.check_image(int(channels), int(height), int(width))
        result = self.score(outputs, list(prompts), list(metadata) if metadata else None)
        if self.name not in result.scores:
            raise ValueError(f"reward {self.name!r} returned no score named {self.name!r}")
        for key, value in result.scores.items():
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != (len(prompts),):
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
                raise ValueError(
                    f"reward {self.name!r}: score {key!r} must be a tensor of shape "
                    f"[{len(prompts)}] (one value per sample), got {shape}"
                )
        return result

    def check_image(self, channels: int, height: int, width: int, what: str = "") -> None:
        """Raise ``RewardInputError`` unless the reward scores images (or frames) of this shape
        (``image_channels``, ``image_size``); ``what`` describes them in the message (e.g. how
        the PNG was converted)."""
        channels_ok = self.image_channels is None or channels in self.image_channels
        size_ok = self.image_size is None or (height, width) == tuple(self.image_size)
        if channels_ok and size_ok:
            return
        allowed = self.image_channels or (1, 3)
        names = " or ".join({1: "grayscale", 3: "RGB"}.get(c, f"{c}-channel") for c in allowed)
        size = f"{self.image_size[0]}x{self.image_size[1]} " if self.image_size else ""
        dims = ", ".join(str(d) for d in self.image_size) if self.image_size else "H, W"
        shape = f"[B, {' or '.join(str(c) for c in allowed)}, {dims}]"
        raise RewardInputError(
            f"reward {self.name!r} scores {size}{names} images ({shape}), got {channels}-channel "
            f"{height}x{width}{what}"
        )

    def check_prompts(self, prompts: Sequence[str], metadata: Sequence[Any] | None) -> None:
        """Raise ``RewardInputError`` for a prompt (or metadata) this reward cannot score. Cheap
        and without the model: a reward server calls it before decoding a request, so that a
        bad prompt is refused alone instead of failing a merged batch. Default: all accepted."""
        del prompts, metadata

    @abc.abstractmethod
    def score(
        self, outputs: Any, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        """Score a batch; ``scores[self.name]`` is the primary ``[B]`` score."""

    # Stateful rewards (e.g. an adversarial head) override these so checkpoints include them.
    def update(
        self,
        outputs: Any,
        prompts: list[str],
        metadata: Any = None,
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """Learn from this iteration's samples (called by the trainer after scoring them);
        returns metrics. ``gather`` concatenates a ``[n, ...]`` tensor over all processes, so
        that every process can make the same update."""
        del outputs, prompts, metadata, gather
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


def local_or_hub_file(
    path: str | None, repo: str, filename: str, reward: str, argument: str = "checkpoint"
) -> Path:
    """``path`` when given (it must exist), else ``filename`` of the hub repository ``repo``
    (downloaded once into the Hugging Face cache); ``argument`` is the reward's keyword that
    takes the local file instead."""
    if path is not None:
        local = Path(path)
        if not local.is_file():
            raise FileNotFoundError(f"{reward}: {local} not found")
        return local
    from huggingface_hub import hf_hub_download

    from loading.hub import require_local_or_reachable

    require_local_or_reachable(repo, local_hint(argument, "FILE"), filename=filename)

    return Path(hf_hub_download(repo, filename))


def local_hint(argument: str, kind: str = "DIR") -> str:
    """How to give a reward a local copy instead of a hub id, for offline-error messages."""
    kwargs = json.dumps({argument: kind})
    return f"the reward's {argument!r} argument, e.g. --set 'reward.0.kwargs={kwargs}'"


def _batch_len(outputs: Any) -> int:
    return outputs.shape[0] if isinstance(outputs, torch.Tensor) else len(outputs)


class CallableReward(RewardModel):
    """Wrap ``fn(prompts, completions, **columns) -> list[float | None]`` (TRL convention).

    ``None`` means "not applicable to this sample": the score is NaN there and ``applicable`` is
    False, so a composite skips it instead of failing.
    """

    def __init__(self, fn: Callable[..., Sequence[float | None]], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or str(getattr(fn, "__name__", "callable_reward"))
        self.by_keyword = _takes_keyword(fn, "completions")

    def score(
        self, outputs: Any, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> RewardOutput:
        columns: dict[str, list[Any]] = {}
        for row in metadata or []:
            for key, value in row.items():
                columns.setdefault(key, []).append(value)
        # TRL calls its reward functions with keywords only, so ``fn(completions, answer,
        # **kwargs)`` (no ``prompts`` first) works there; a function whose parameters have
        # other names gets prompts and completions by position.
        if self.by_keyword:
            values = list(self.fn(prompts=prompts, completions=outputs, **columns))
        else:
            values = list(self.fn(prompts, outputs, **columns))
        if len(values) != len(prompts):
            raise ValueError(
                f"reward function {self.name!r} returned {len(values)} values for "
                f"{len(prompts)} samples"
            )
        numbers = [self._number(v, i, len(values)) for i, v in enumerate(values)]
        applicable = torch.tensor([v is not None for v in numbers])
        scores = torch.tensor([float("nan") if v is None else v for v in numbers])
        return RewardOutput({self.name: scores}, {self.name: applicable})

    def _number(self, value: Any, index: int, count: int) -> float | None:
        """``value`` as a float, None as it is; a string or a boolean is refused rather than
        converted (``float("0.5")`` and ``float(True)`` would hide a function returning the
        wrong thing)."""
        if value is None:
            return None
        refused = isinstance(value, str | bytes | bool) or "bool" in str(
            getattr(value, "dtype", "")
        )
        try:
            number = None if refused else float(value)
        except (TypeError, ValueError):
            number = None
        if number is None:
            raise ValueError(
                f"reward function {self.name!r} returned {value!r} ({type(value).__name__}) "
                f"for sample {index} of the {count} it scored; return a number per sample, or "
                "None where the reward does not apply"
            )
        return number


def _takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes ``name`` by keyword: a parameter of that name, or only ``**kwargs``
    (``fn(p, c, **kwargs)`` names its first two itself and gets them by position)."""
    import inspect

    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: call it positionally
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.name == name and p.kind is not inspect.Parameter.POSITIONAL_ONLY for p in parameters):
        return True
    return not any(p.kind in positional for p in parameters) and any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
    )
