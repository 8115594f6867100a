"""Serve any reward model over HTTP with JSON (``genrl serve-reward NAME``).

The HTTP front decodes requests and hands them to the scoring side; each model replica has one
scoring worker (``replicas.py``) that merges queued requests into batches of up to
``max_batch_size`` samples (images of one size, or texts) within ``batch_wait_s``, scores each
batch with one call and hands every request its own rows back, so concurrent trainer processes
share forwards. Several replicas (one model instance per device) sit behind one endpoint, each
request going to the least-loaded one. Requests are checked before they reach a model: a shared
token (``Authorization: Bearer ...``, compared in constant time), a size limit, the wire format
of ``reward_models/wire.py``, the per-request limits of ``limits.RequestLimits`` (400) and what
the reward scores (the kinds it ``accepts``, ``check_image`` on the PNG headers'
shape and ``check_prompts``: 422); images are decoded only within the server-wide limits of
``requests.DecodeLimits`` (503 when full). A request not scored within ``request_timeout_s``
gets a 504. Every reply is JSON, errors ``{"error": ..., "request_id": ...}``; a reward's
``RewardInputError`` is the client's 422 with its message, any other failure is logged under
the request id and never sent to the client (500). A replica whose call fails is taken out of
rotation and its requests are retried once on another (``replicas.py``).

The HTTP front is a Starlette app on uvicorn (``asgi.py``; needs ``pip install
'genrl[server]'``): one event loop for every connection, no thread parked per waiting request.

    server = RewardServer(build_reward("pickscore"), port=8000, token="secret")
    server.serve_forever()          # or server.start() for a background thread
    RewardServer([build_reward("pickscore", device=f"cuda:{i}") for i in range(2)], ...)
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from reward_models.base import RewardModel
from reward_models.serving.jobs import Job, internal_error, joined
from reward_models.serving.limits import HEADER_TIMEOUT_S, MAX_CONNECTIONS, RequestLimits
from reward_models.serving.replicas import Replicas
from reward_models.serving.requests import DecodeLimits, ScoreRequest, parse_score_request
from reward_models.wire import VERSION

if TYPE_CHECKING:
    from reward_models.serving.asgi import AsgiFront

logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class RewardServer:
    """HTTP front of one reward model, or of several replicas of it.

    Args:
        reward: the model to serve, or a list of distinct instances of it (one replica each,
            e.g. one per device), each scored by its own worker.
        host, port: where to listen (port 0: any free port, see ``address``).
        token: shared secret clients must send; required unless ``host`` is a loopback address.
        max_request_bytes: larger request bodies are refused with 413.
        max_pixels: the most pixels a request's images may hold together once decoded (a small
            PNG can decode to a huge image); more is refused with 400 before decoding.
        max_samples: the most outputs in one request (400 beyond).
        max_prompt_bytes: the most UTF-8 bytes a request's prompts may hold together (400).
        max_json_depth: the deepest nesting of the body's arrays and objects (400 beyond,
            checked before the body is parsed).
        pixel_budget: the most decoded pixels all requests together may hold, from decoding
            until scored (float32 RGB: 12 bytes each); at least ``max_pixels``.
        max_decodes: requests decoding images at once.
        max_wait_s: how long a request waits for room in the pixel budget and for a decode
            slot; then it gets 503 with Retry-After (the client retries).
        max_batch_size: samples per reward call (merged requests; larger requests are split
            into parts of this many, scored and failed over on their own).
        batch_wait_s: how long a scoring worker waits for more requests to merge.
        request_timeout_s: a request not scored within this gets 504.
        header_timeout_s: a request head (request line and headers) not complete this long
            after the connection opened, or after its first byte on a kept-alive connection,
            gets 408 and the connection is closed (slow-header clients).
        max_connections: connections open at once; one more gets 503 with Retry-After on
            arrival and is closed.

    Raises ``MissingServerExtra`` (an ImportError saying what to install) without starlette
    and uvicorn.
    """

    def __init__(
        self,
        reward: RewardModel | Sequence[RewardModel],
        host: str = "127.0.0.1",
        port: int = 8000,
        token: str | None = None,
        max_request_bytes: int = 64 * 2**20,
        max_pixels: int = 64 * 2**20,
        max_samples: int = 512,
        max_prompt_bytes: int = 2**20,
        max_json_depth: int = 32,
        pixel_budget: int = 128 * 2**20,
        max_decodes: int = 4,
        max_wait_s: float = 10.0,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.01,
        request_timeout_s: float = 300.0,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if not token and host not in LOOPBACK:
            raise ValueError(
                f"serving on {host!r} without a token would let anyone on the network use the "
                "model; set a token (GENRL_REWARD_TOKEN) or listen on 127.0.0.1"
            )
        if max_batch_size < 1 or max_request_bytes < 1 or max_connections < 1:
            raise ValueError("max_batch_size, max_request_bytes and max_connections must be >= 1")
        if header_timeout_s <= 0:
            raise ValueError(f"header_timeout_s must be > 0, got {header_timeout_s}")
        if max_pixels > pixel_budget:
            raise ValueError(
                f"max_pixels ({max_pixels}) must fit the pixel budget ({pixel_budget}): a "
                "request within its own limit could never be decoded"
            )
        rewards = [reward] if isinstance(reward, RewardModel) else list(reward)
        self.token = token
        self.max_request_bytes = max_request_bytes
        self.max_pixels = max_pixels
        self.request_limits = RequestLimits(
            max_pixels, max_samples, max_prompt_bytes, max_json_depth
        )
        self.limits = DecodeLimits(pixel_budget, max_decodes, max_wait_s)
        self.max_batch_size = max_batch_size
        self.request_timeout_s = request_timeout_s
        self.header_timeout_s = header_timeout_s
        self.max_connections = max_connections
        self.replicas = Replicas(rewards, self.limits, max_batch_size, batch_wait_s)
        self.reward = rewards[0]  # what every replica is a copy of
        self.batch_sizes = self.replicas.batch_sizes  # samples per reward call, all replicas
        self._front = _make_front(self, host, port)  # listening from here on
        self._started = False

    @property
    def address(self) -> str:
        return self._front.address

    def start(self) -> RewardServer:
        """Serve from background threads; returns self (``address`` tells where)."""
        self.replicas.start()
        self._started = True
        self._front.start()
        return self

    def serve_forever(self) -> None:
        self.replicas.start()
        self._started = True
        try:
            self._front.serve_forever()
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Stop listening (the port is released) and stop the scoring workers."""
        self._front.shutdown()
        self.replicas.stop()

    def describe(self) -> dict[str, Any]:
        """What ``GET /health`` answers: the reward, what it scores, the limits, the replicas."""
        channels, size = self.reward.image_channels, self.reward.image_size
        return {
            "version": VERSION,
            "reward": self.reward.name,
            "accepts": list(self.reward.accepts),
            "image_channels": list(channels) if channels is not None else None,
            "image_size": list(size) if size is not None else None,
            "replicas": len(self.replicas),
            "replica_health": self.replicas.health(),
            "limits": {
                "max_request_bytes": self.max_request_bytes,
                **self.request_limits.describe(),
                "pixel_budget": self.limits.pixels.capacity,
                "max_batch_size": self.max_batch_size,
                "header_timeout_s": self.header_timeout_s,
                "max_connections": self.max_connections,
            },
        }

    # -- the steps of POST /score the front takes (blocking ones in a worker thread) -----------
    def authorised(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries the token (constant-time compare)."""
        if not self.token:
            return True
        return hmac.compare_digest((header or "").encode(), f"Bearer {self.token}".encode())

    def parse(self, body: bytes) -> ScoreRequest:
        """The checked request (raises ``RequestError``: 400, 415, 422); images not decoded."""
        return parse_score_request(body, self.reward, self.request_limits)

    def admit(self, request: ScoreRequest, request_id: str) -> Job:
        """The request as a job, its images decoded within the server's limits (their pixels
        now taken from the budget until the job is scored). May wait up to ``max_wait_s``;
        raises ``RequestError`` (503 with Retry-After, 400 for corrupt PNG data). A request of
        more than ``max_batch_size`` samples is one job of several parts (``jobs.joined``)."""
        size = self.max_batch_size
        if request.kind == "texts":
            texts = request.texts  # no texts: one empty part, scored as before
            outputs: list[Any] = [texts[i : i + size] for i in range(0, max(1, len(texts)), size)]
        else:
            outputs = self.limits.decode(request, size)
        parts = []
        for index, part in enumerate(outputs):
            rows = slice(index * size, (index + 1) * size)
            metadata = request.metadata[rows] if request.metadata is not None else None
            parts.append(Job(request_id, request.prompts[rows], part, metadata))
            parts[-1].pixels = parts[-1].decoded_pixels  # taken from the budget by decode
        return parts[0] if len(parts) == 1 else joined(request_id, parts)

    def dispatch(self, job: Job) -> None:
        """Queue the job (or its parts) on the least-loaded replicas (returns at once)."""
        self.replicas.dispatch(job.parts or [job])

    def outcome(self, job: Job) -> tuple[HTTPStatus, dict[str, Any]]:
        """The reply to a job once scored, failed or timed out (then marked abandoned, so that
        its worker drops it instead of scoring it for nobody)."""
        if job.result is not None:
            return HTTPStatus.OK, job.result
        if job.refusal is not None:  # the reward cannot score what the client sent
            return HTTPStatus.UNPROCESSABLE_ENTITY, {"error": job.refusal}
        if job.failed:
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": internal_error(job.request_id)}
        job.abandon()
        message = f"not scored within {self.request_timeout_s:g} s"
        return HTTPStatus.GATEWAY_TIMEOUT, {"error": message}


class MissingServerExtra(ImportError):
    """The ASGI front's libraries (starlette, uvicorn) are not installed."""


def check_front() -> None:
    """Raise ``MissingServerExtra`` (saying what to install) when the front cannot run."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise MissingServerExtra(
            f"the reward server needs starlette and uvicorn ({err}); install them with "
            "`pip install 'genrl[server]'`"
        ) from None


def _make_front(server: RewardServer, host: str, port: int) -> AsgiFront:
    check_front()
    from reward_models.serving.asgi import AsgiFront

    return AsgiFront(server, host, port)


__all__ = ["MissingServerExtra", "RewardServer", "check_front"]
