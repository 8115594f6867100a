"""The per-request limits of the reward server, checked before anything is decoded.

``GET /health`` reports them (``RequestLimits.describe``) and ``requests.parse_score_request``
enforces them: the JSON nesting depth from the raw body before it is parsed (so that deeply
nested JSON never reaches the parser's recursion), then the number of samples and the prompts'
size, then the images' pixels from their PNG headers. A request over one gets a 400 naming the
limit; what the reward itself cannot score is a 422 (``reward_models.base.RewardInputError``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reward_models.wire import WireError

# A JSON string, escapes included: its brackets are text, not nesting.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SCAN_CHUNK = 2**20  # bytes of structure scanned at a time (bounded memory, early exit)

# The connection limits (``protocol.JSONH11Protocol``). A client writes its request head in one
# send right after connecting (httpx, urllib), so the head arrives within a round trip; 10 s
# leaves room for a congested link or an event loop held up for a moment by scoring threads, and
# bounds what a slow-header client holds to 10 s.
HEADER_TIMEOUT_S = 10.0
# Well under the common soft limit of 1024 file descriptors per process (the model's files and
# CUDA need some), and twice what a large run opens: 64 ranks x 4 concurrent requests.
MAX_CONNECTIONS = 512


@dataclass(frozen=True)
class RequestLimits:
    """What one ``POST /score`` may hold.

    Args:
        max_pixels: decoded pixels of a request's images (every frame of its videos) together,
            counted from the PNG headers.
        max_samples: outputs (and prompts) in one request.
        max_prompt_bytes: UTF-8 bytes of a request's prompts together.
        max_json_depth: nesting of arrays and objects in the body (a request needs 3, metadata
            objects a few more).
    """

    max_pixels: int = 64 * 2**20
    max_samples: int = 512
    max_prompt_bytes: int = 2**20
    max_json_depth: int = 32

    def __post_init__(self) -> None:
        for name in ("max_pixels", "max_samples", "max_prompt_bytes", "max_json_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def describe(self) -> dict[str, int]:
        return {
            "max_pixels": self.max_pixels,
            "max_samples": self.max_samples,
            "max_prompt_bytes": self.max_prompt_bytes,
            "max_json_depth": self.max_json_depth,
        }

    def check_depth(self, body: bytes) -> None:
        """Raise ``WireError`` when the body's arrays and objects nest deeper than
        ``max_json_depth`` (brackets inside strings do not count)."""
        depth = json_depth(body, self.max_json_depth)
        if depth > self.max_json_depth:
            raise WireError(
                f"JSON nested deeper than the server's limit of {self.max_json_depth} levels "
                "(limits.max_json_depth in GET /health)"
            )

    def check_samples(self, prompts: Sequence[str]) -> None:
        """Raise ``WireError`` for more samples, or more prompt bytes, than allowed."""
        if len(prompts) > self.max_samples:
            raise WireError(
                f"{len(prompts)} samples exceed the server's limit of {self.max_samples} per "
                "request (limits.max_samples in GET /health); send smaller requests "
                "(RemoteReward's max_batch_size)"
            )
        size = sum(len(p.encode("utf-8", "surrogatepass")) for p in prompts)
        if size > self.max_prompt_bytes:
            raise WireError(
                f"the prompts hold {size} bytes, over the server's limit of "
                f"{self.max_prompt_bytes} per request (limits.max_prompt_bytes in GET /health)"
            )


def json_depth(body: bytes, stop_above: int | None = None) -> int:
    """The deepest nesting of arrays and objects in ``body``, without parsing it (and without
    recursion): strings are cut out, then the running count of opening minus closing brackets
    is scanned a chunk at a time, stopping once it passes ``stop_above``. Malformed JSON gives
    some number; the parser refuses it afterwards."""
    import numpy as np

    structure = np.frombuffer(_STRING.sub(b"", body), dtype=np.uint8)
    deepest, level = 0, 0
    for start in range(0, len(structure), _SCAN_CHUNK):
        chunk = structure[start : start + _SCAN_CHUNK]
        steps = (chunk == ord("[")).astype(np.int32)
        steps += chunk == ord("{")
        steps -= chunk == ord("]")
        steps -= chunk == ord("}")
        running = np.cumsum(steps, dtype=np.int64) + level
        deepest = max(deepest, int(running.max(initial=level)))
        level = int(running[-1])
        if stop_above is not None and deepest > stop_above:
            break
    return deepest


def describe_picture(picture: Any, index: int) -> str:
    """How image ``index`` reads from its header, for a refusal: `` (image 0: PNG mode
    'RGBA', decoded as RGB, alpha dropped)``."""
    mode = picture.mode
    if mode in ("L", "RGB"):
        return f" (image {index}: PNG mode {mode!r})"
    dropped = ", alpha dropped" if "A" in mode else ""
    return f" (image {index}: PNG mode {mode!r}, decoded as RGB{dropped})"


__all__ = ["RequestLimits", "describe_picture", "json_depth"]
