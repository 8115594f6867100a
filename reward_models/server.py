"""Serve any reward model over HTTP with JSON (``genrl serve-reward NAME``).

One scoring thread owns the model; HTTP handler threads decode requests and queue them. The
scoring thread merges queued requests into batches of up to ``max_batch_size`` samples (images of
one size, or texts) within ``batch_wait_s``, scores each batch with one call and hands every
request its own rows back, so concurrent trainer processes share forwards. Requests are checked
before they reach the model: a shared token (``Authorization: Bearer ...``, compared in constant
time), a size limit, and the wire format of ``reward_models/wire.py``; a request that waits longer
than ``request_timeout_s`` gets a 504.

    server = RewardServer(build_reward("pickscore"), port=8000, token="secret")
    server.serve_forever()          # or server.start() for a background thread
"""

from __future__ import annotations

import hmac
import json
import queue
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from reward_models.base import RewardModel
from reward_models.wire import VERSION, WireError, decode_outputs, encode_scores

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class _Job:
    prompts: list[str]
    outputs: Any
    metadata: list[dict[str, Any]] | None
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    error: str | None = None
    abandoned: bool = False  # its client got a 504: not worth scoring any more

    def __len__(self) -> int:
        return len(self.prompts)

    def key(self) -> tuple:
        """Jobs with equal keys can share a batch (same kind, same image size)."""
        if isinstance(self.outputs, torch.Tensor):
            return ("images", *self.outputs.shape[1:])
        return ("texts",)


class RewardServer:
    """HTTP front of one reward model.

    Args:
        reward: the model to serve.
        host, port: where to listen (port 0: any free port, see ``address``).
        token: shared secret clients must send; required unless ``host`` is a loopback address.
        max_request_bytes: larger request bodies are refused with 413.
        max_pixels: the most pixels a request's images may hold together once decoded (a small
            PNG can decode to a huge image); more is refused with 400 before decoding.
        max_batch_size: samples per reward call (merged requests; larger requests are split).
        batch_wait_s: how long the scoring thread waits for more requests to merge.
        request_timeout_s: a request not scored within this gets 504.
    """

    def __init__(
        self,
        reward: RewardModel,
        host: str = "127.0.0.1",
        port: int = 8000,
        token: str | None = None,
        max_request_bytes: int = 64 * 2**20,
        max_pixels: int = 64 * 1024 * 1024,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.01,
        request_timeout_s: float = 300.0,
    ) -> None:
        if not token and host not in LOOPBACK:
            raise ValueError(
                f"serving on {host!r} without a token would let anyone on the network use the "
                "model; set a token (GENRL_REWARD_TOKEN) or listen on 127.0.0.1"
            )
        if max_batch_size < 1 or max_request_bytes < 1:
            raise ValueError("max_batch_size and max_request_bytes must be >= 1")
        self.reward = reward
        self.token = token
        self.max_request_bytes = max_request_bytes
        self.max_pixels = max_pixels
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.request_timeout_s = request_timeout_s
        self.batch_sizes: list[int] = []  # samples per reward call, for tests and logs
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._scorer = threading.Thread(target=self._score_loop, daemon=True)
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RewardServer:
        """Serve from background threads; returns self (``address`` tells where)."""
        self._scorer.start()
        thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def serve_forever(self) -> None:
        self._scorer.start()
        try:
            self._httpd.serve_forever()
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Stop listening (the port is released) and stop the scoring thread."""
        if self._threads:
            self._httpd.shutdown()
        self._httpd.server_close()
        self._jobs.put(None)

    # -- scoring thread -----------------------------------------------------------------------
    def submit(self, job: _Job) -> None:
        self._jobs.put(job)
        if not job.done.wait(self.request_timeout_s):
            job.abandoned = True
            job.error = f"not scored within {self.request_timeout_s:g} s"

    def _score_loop(self) -> None:
        pending: list[_Job] = []
        while True:
            job = pending.pop(0) if pending else self._jobs.get()
            if job is None:
                return
            if job.abandoned:  # a retry of it may already be queued
                continue
            batch, size = [job], len(job)
            deadline = time.monotonic() + self.batch_wait_s
            while size < self.max_batch_size:
                try:
                    other = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if other is None:
                    self._jobs.put(None)
                    break
                if other.abandoned:
                    continue
                if other.key() == job.key() and size + len(other) <= self.max_batch_size:
                    batch.append(other)
                    size += len(other)
                else:
                    pending.append(other)
            self._score(batch)

    def _score(self, batch: list[_Job]) -> None:
        prompts = [p for job in batch for p in job.prompts]
        if isinstance(batch[0].outputs, torch.Tensor):
            outputs: Any = torch.cat([job.outputs for job in batch])
        else:
            outputs = [t for job in batch for t in job.outputs]
        metadata = None
        if any(job.metadata for job in batch):
            metadata = [m for job in batch for m in (job.metadata or [{}] * len(job))]
        try:
            chunks = []
            for start in range(0, len(prompts), self.max_batch_size):
                stop = start + self.max_batch_size
                self.batch_sizes.append(len(prompts[start:stop]))
                chunks.append(
                    self.reward(
                        outputs[start:stop],
                        prompts[start:stop],
                        metadata[start:stop] if metadata else None,
                    )
                )
            scores = {
                k: torch.cat([c.scores[k].float().cpu() for c in chunks]) for k in chunks[0].scores
            }
            applicable = {
                k: torch.cat(
                    [
                        c.applicable.get(k, torch.ones(len(c.scores[k]), dtype=torch.bool)).cpu()
                        for c in chunks
                    ]
                )
                for k in chunks[0].applicable
            }
        except Exception as err:  # reported to every client of the batch
            for job in batch:
                job.error = f"reward {self.reward.name!r} failed: {err!r}"
                job.done.set()
            return
        start = 0
        for job in batch:
            rows = slice(start, start + len(job))
            job.result = {
                "version": VERSION,
                "reward": self.reward.name,
                "scores": encode_scores({k: v[rows] for k, v in scores.items()}),
                "applicable": {k: v[rows].tolist() for k, v in applicable.items()},
            }
            start += len(job)
            job.done.set()


def _handler_for(server: RewardServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 60  # seconds a client may take to send its request (socket timeout)

        def log_message(self, format: str, *args: Any) -> None:
            del format, args  # quiet: a trainer calls many times a minute

        def _reply(self, status: HTTPStatus, body: dict[str, Any]) -> None:
            if status >= 400:
                # The body of a refused request may be unread: it must not be taken for the
                # next request of a kept-alive connection.
                self.close_connection = True
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            if not server.token:
                return True
            sent = self.headers.get("Authorization", "")
            return hmac.compare_digest(sent.encode(), f"Bearer {server.token}".encode())

        def do_GET(self) -> None:
            if self.path != "/health":
                self._reply(HTTPStatus.NOT_FOUND, {"error": "GET /health or POST /score"})
            elif not self._authorised():
                self._reply(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong token"})
            else:
                self._reply(HTTPStatus.OK, {"version": VERSION, "reward": server.reward.name})

        def do_POST(self) -> None:
            if self.path != "/score":
                self._reply(HTTPStatus.NOT_FOUND, {"error": "POST /score"})
                return
            if not self._authorised():
                self._reply(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong token"})
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._reply(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length required"})
                return
            if length < 0:
                self._reply(HTTPStatus.BAD_REQUEST, {"error": "negative Content-Length"})
                return
            if length > server.max_request_bytes:
                self._reply(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    {"error": f"request of {length} bytes exceeds {server.max_request_bytes}"},
                )
                return
            try:
                job = _parse(self.rfile.read(length), server.max_pixels)
            except WireError as err:
                self._reply(HTTPStatus.BAD_REQUEST, {"error": str(err)})
                return
            server.submit(job)
            if job.result is not None:
                self._reply(HTTPStatus.OK, job.result)
            elif job.error and job.error.startswith("not scored"):
                self._reply(HTTPStatus.GATEWAY_TIMEOUT, {"error": job.error})
            else:
                self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": job.error})

    return Handler


def _parse(body: bytes, max_pixels: int) -> _Job:
    try:
        request = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise WireError(f"body is not JSON: {err}") from err
    if not isinstance(request, dict):
        raise WireError("body must be a JSON object")
    if request.get("version") != VERSION:
        raise WireError(f"wire version must be {VERSION}, got {request.get('version')!r}")
    prompts = request.get("prompts")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise WireError('"prompts" must be a list of strings')
    outputs = decode_outputs(request.get("outputs"), max_pixels)
    if len(outputs) != len(prompts):
        raise WireError(f"{len(outputs)} outputs but {len(prompts)} prompts")
    metadata = request.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, list)
        or len(metadata) != len(prompts)
        or not all(isinstance(m, dict) for m in metadata)
    ):
        raise WireError('"metadata" must be null or one object per prompt')
    return _Job(prompts, outputs, metadata)


__all__ = ["RewardServer"]
