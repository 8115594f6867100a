"""Requests of the reward server (``server.py``): parsing, and the server-wide decoding limits.

A ``POST /score`` is parsed in two steps so that nothing large is decoded before it is admitted.
``parse_score_request`` checks the JSON against the request limits (``limits.RequestLimits``),
the output kind against what the reward ``accepts``, opens the images from their headers only
(encoding, sizes, the per-request pixel limit) and asks the reward whether it can score them
(``RewardModel.check_image`` on the header's shape, ``check_prompts``: a 422 if not). Then
``DecodeLimits.decode`` takes the request's pixels from the server's ``PixelBudget`` and one of
its decode slots, waiting at most ``max_wait_s`` for both, before the pixels are decoded. The
pixels stay taken until the request is scored (its float copy lives until then), and the scoring
thread takes the copy of a merge of requests from the budget too, so the decoded images held by
the server never exceed the budget, however many requests arrive.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import torch

from reward_models.base import RewardInputError, RewardModel
from reward_models.logs import clip
from reward_models.serving.limits import RequestLimits, describe_picture
from reward_models.wire import (
    VERSION,
    UnsupportedFormat,
    WireError,
    as_videos,
    decode_images,
    decode_texts,
    image_pixels,
    open_images,
    open_videos,
    output_kind,
    picture_shape,
)


class RequestError(Exception):
    """A refused request: its HTTP status, the message for the client, extra headers."""

    def __init__(
        self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class ScoreRequest:
    """A parsed ``POST /score``; images (or video frames, flattened) are opened (headers
    read) but not decoded yet."""

    prompts: list[str]
    metadata: list[dict[str, Any]] | None
    kind: str
    texts: list[str] = field(default_factory=list)
    pictures: list[Any] = field(default_factory=list)
    frames: int = 1  # pictures per output: a video's frame count, 1 for images

    @property
    def pixels(self) -> int:
        return image_pixels(self.pictures)


def parse_score_request(body: bytes, reward: RewardModel, limits: RequestLimits) -> ScoreRequest:
    """Check a request body against the wire format, the limits and what ``reward`` scores.

    Raises ``RequestError``: 400 for a malformed request, one over a limit or of a kind the
    reward does not take, 415 for images in an encoding the wire format does not carry, 422 for
    prompts or image sizes the reward says it cannot score.
    """
    try:
        return _parse(body, reward, limits)
    except UnsupportedFormat as err:
        raise RequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, str(err)) from None
    except RewardInputError as err:  # may quote a prompt of any length
        raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY, clip(err, 1000)) from None
    except WireError as err:
        raise RequestError(HTTPStatus.BAD_REQUEST, str(err)) from None


def _parse(body: bytes, reward: RewardModel, limits: RequestLimits) -> ScoreRequest:
    limits.check_depth(body)  # before the parser, whose recursion deep nesting would exhaust
    try:
        request = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise WireError(f"body is not JSON: {err}") from err
    except RecursionError:  # not reached within the depth limit; kept a 400 if it were
        raise WireError("JSON nested too deeply") from None
    if not isinstance(request, dict):
        raise WireError("body must be a JSON object")
    version = request.get("version")
    # The type too: True == 1 and 1.0 == 1 in Python, but neither is the integer 1 on the wire
    # (bool is a subclass of int, so isinstance would let True through).
    if type(version) is not int or version != VERSION:
        got = clip(repr(version), 100)  # a client's string of any length
        raise WireError(f'"version" (the wire version) must be the integer {VERSION}, got {got}')
    prompts = request.get("prompts")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise WireError('"prompts" must be a list of strings')
    limits.check_samples(prompts)
    metadata = request.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, list)
        or len(metadata) != len(prompts)
        or not all(isinstance(m, dict) for m in metadata)
    ):
        raise WireError('"metadata" must be null or one object per prompt')
    payload = request.get("outputs")
    kind = output_kind(payload)
    # Before anything is decoded: a reward given the wrong kind would fail inside the model.
    if kind not in reward.accepts:
        accepted = " or ".join(reward.accepts)
        raise WireError(f"reward {reward.name!r} accepts {accepted}, not {kind}")
    items = payload[kind] if isinstance(payload, dict) else None
    if isinstance(items, list) and len(items) != len(prompts):  # before opening any image
        raise WireError(f"{len(items)} outputs but {len(prompts)} prompts")
    parsed = ScoreRequest(prompts, metadata, kind)
    if kind == "texts":
        parsed.texts = decode_texts(payload)
    elif kind == "videos":
        parsed.pictures, parsed.frames = open_videos(payload, limits.max_pixels)
    else:
        parsed.pictures = open_images(payload, limits.max_pixels)
    if parsed.pictures:  # one shape per request (open_images checks): the first tells
        channels, height, width = picture_shape(parsed.pictures[0])
        reward.check_image(channels, height, width, describe_picture(parsed.pictures[0], 0))
    reward.check_prompts(prompts, metadata)
    return parsed


class PixelBudget:
    """Decoded pixels in flight, server-wide: ``acquire`` takes some (waiting, first come first
    served, at most ``timeout`` seconds), ``release`` gives them back.

    First come first served, so that a large request is not starved by a stream of small ones
    that would each fit in what is left.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a pixel budget must be >= 1 pixel")
        self.capacity = capacity
        self.in_use = 0
        self.waited = 0  # acquisitions that had to queue (tests, logs)
        self._changed = threading.Condition()
        self._queue: deque[object] = deque()

    @property
    def waiting(self) -> int:
        with self._changed:
            return len(self._queue)

    def acquire(self, pixels: int, timeout: float) -> bool:
        """Take ``pixels``; False if they were not free within ``timeout`` seconds."""
        if pixels > self.capacity:
            raise ValueError(f"{pixels} pixels can never fit a budget of {self.capacity}")
        with self._changed:
            if not self._queue and self.in_use + pixels <= self.capacity:
                self.in_use += pixels
                return True
            ticket = object()
            self._queue.append(ticket)
            self.waited += 1
            deadline = time.monotonic() + timeout
            try:
                while self._queue[0] is not ticket or self.in_use + pixels > self.capacity:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._changed.wait(left)
                self.in_use += pixels
                return True
            finally:
                self._queue.remove(ticket)
                self._changed.notify_all()  # the next in line may fit now

    def try_acquire(self, pixels: int) -> bool:
        """Take ``pixels`` if they are free now, without waiting (nor queueing)."""
        with self._changed:
            if self.in_use + pixels > self.capacity:
                return False
            self.in_use += pixels
            return True

    def release(self, pixels: int) -> None:
        with self._changed:
            self.in_use -= pixels
            self._changed.notify_all()


class DecodeLimits:
    """The server-wide limits on decoding images.

    Args:
        pixel_budget: the most decoded pixels held at once, from decoding until scored (about 12
            bytes each as float32 RGB).
        max_decodes: images decoded at once; each decode also holds PIL's and numpy's uint8
            copies for a moment.
        max_wait_s: how long a request may wait for both before a 503.
        retry_after_s: the Retry-After sent with that 503.
    """

    def __init__(
        self, pixel_budget: int, max_decodes: int, max_wait_s: float, retry_after_s: float = 1.0
    ) -> None:
        if max_decodes < 1 or max_wait_s < 0:
            raise ValueError("max_decodes must be >= 1 and max_wait_s >= 0")
        self.pixels = PixelBudget(pixel_budget)
        self.max_decodes = max_decodes
        self.max_wait_s = max_wait_s
        self.retry_after = str(max(1, math.ceil(retry_after_s)))  # whole seconds (RFC 9110)
        self._slots = threading.BoundedSemaphore(max_decodes)

    def decode(self, request: ScoreRequest, part_size: int) -> list[torch.Tensor]:
        """The request's images as float tensors of at most ``part_size`` outputs each (one
        per part of the request: no copy is made to split it). Their pixels stay taken: the
        caller gives them back with ``release`` once the tensors are dropped. Raises
        ``RequestError`` (503 with Retry-After when the server is full, 400 for corrupt image
        data)."""
        pixels = request.pixels
        deadline = time.monotonic() + self.max_wait_s
        if not self.pixels.acquire(pixels, self.max_wait_s):
            raise self._busy(
                f"{pixels} decoded pixels do not fit the server's budget ({self.pixels.in_use} "
                f"of {self.pixels.capacity} in flight)"
            )
        try:
            if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise self._busy(f"all {self.max_decodes} decode slots are in use")
            try:
                step = part_size * request.frames  # pictures per part (frames of its videos)
                parts = []
                for start in range(0, len(request.pictures), step):
                    decoded = decode_images(request.pictures[start : start + step])
                    videos = request.kind == "videos"
                    parts.append(as_videos(decoded, request.frames) if videos else decoded)
                return parts
            finally:
                self._slots.release()
        except WireError as err:
            self.release(pixels)
            raise RequestError(HTTPStatus.BAD_REQUEST, str(err)) from None
        except BaseException:
            self.release(pixels)
            raise

    def release(self, pixels: int) -> None:
        self.pixels.release(pixels)

    def _busy(self, why: str) -> RequestError:
        return RequestError(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"server busy: {why} after waiting {self.max_wait_s:g} s; retry later",
            {"Retry-After": self.retry_after},
        )


__all__ = ["DecodeLimits", "PixelBudget", "RequestError", "ScoreRequest", "parse_score_request"]
