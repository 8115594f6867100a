"""Serve any reward model over HTTP with JSON (``genrl serve-reward NAME``).

One scoring thread owns the model; HTTP handler threads decode requests and queue them. The
scoring thread merges queued requests into batches of up to ``max_batch_size`` samples (images of
one size, or texts) within ``batch_wait_s``, scores each batch with one call and hands every
request its own rows back, so concurrent trainer processes share forwards. Requests are checked
before they reach the model: a shared token (``Authorization: Bearer ...``, compared in constant
time), a size limit, the wire format of ``reward_models/wire.py`` and the kinds of output the
reward ``accepts``; images are decoded only within the server-wide limits of
``server_requests.DecodeLimits`` (503 when full). A request that waits longer than
``request_timeout_s`` gets a 504. Every reply is JSON, errors ``{"error": ..., "request_id": ...}``;
internal failures are logged under the request id and never sent to the client.

    server = RewardServer(build_reward("pickscore"), port=8000, token="secret")
    server.serve_forever()          # or server.start() for a background thread
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import torch

from reward_models.base import RewardModel
from reward_models.server_http import JSONHTTPServer, handler_for
from reward_models.server_requests import DecodeLimits, Job
from reward_models.wire import VERSION, encode_scores

logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class RewardServer:
    """HTTP front of one reward model.

    Args:
        reward: the model to serve.
        host, port: where to listen (port 0: any free port, see ``address``).
        token: shared secret clients must send; required unless ``host`` is a loopback address.
        max_request_bytes: larger request bodies are refused with 413.
        max_pixels: the most pixels a request's images may hold together once decoded (a small
            PNG can decode to a huge image); more is refused with 400 before decoding.
        pixel_budget: the most decoded pixels all requests together may hold, from decoding
            until scored (float32 RGB: 12 bytes each); at least ``max_pixels``.
        max_decodes: requests decoding images at once.
        max_wait_s: how long a request waits for room in the pixel budget and for a decode
            slot; then it gets 503 with Retry-After (the client retries).
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
        max_pixels: int = 64 * 2**20,
        pixel_budget: int = 128 * 2**20,
        max_decodes: int = 4,
        max_wait_s: float = 10.0,
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
        if max_pixels > pixel_budget:
            raise ValueError(
                f"max_pixels ({max_pixels}) must fit the pixel budget ({pixel_budget}): a "
                "request within its own limit could never be decoded"
            )
        self.reward = reward
        self.token = token
        self.max_request_bytes = max_request_bytes
        self.max_pixels = max_pixels
        self.limits = DecodeLimits(pixel_budget, max_decodes, max_wait_s)
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.request_timeout_s = request_timeout_s
        self.batch_sizes: list[int] = []  # samples per reward call, for tests and logs
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._httpd = JSONHTTPServer((host, port), handler_for(self))
        self._scorer = threading.Thread(target=self._score_loop, daemon=True)
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
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

    def describe(self) -> dict[str, Any]:
        """What ``GET /health`` answers: the reward, the kinds it accepts, the limits."""
        return {
            "version": VERSION,
            "reward": self.reward.name,
            "accepts": list(self.reward.accepts),
            "limits": {
                "max_request_bytes": self.max_request_bytes,
                "max_pixels": self.max_pixels,
                "pixel_budget": self.limits.pixels.capacity,
                "max_batch_size": self.max_batch_size,
            },
        }

    # -- scoring thread -----------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        self._jobs.put(job)
        if not job.done.wait(self.request_timeout_s):
            job.abandoned = True

    def _score_loop(self) -> None:
        pending: list[Job] = []
        while True:
            job = pending.pop(0) if pending else self._jobs.get()
            if job is None:
                return
            if job.abandoned:  # a retry of it may already be queued
                self._finish(job)
                continue
            batch, size, merge_pixels = [job], len(job), 0
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
                    self._finish(other)
                    continue
                # A merge copies the requests' images into one tensor: that copy is taken from
                # the pixel budget too, and without room for it they are scored one by one.
                extra = other.pixels + (job.pixels if len(batch) == 1 else 0)
                if (
                    other.key() == job.key()
                    and size + len(other) <= self.max_batch_size
                    and self.limits.pixels.try_acquire(extra)
                ):
                    batch.append(other)
                    size += len(other)
                    merge_pixels += extra
                else:
                    pending.append(other)
            try:
                self._score(batch)
            finally:
                for done in batch:
                    self._finish(done)
                if merge_pixels:
                    self.limits.release(merge_pixels)

    def _finish(self, job: Job) -> None:
        """Drop a job's outputs and give its pixels back to the budget (once)."""
        job.outputs = None
        pixels, job.pixels = job.pixels, 0
        if pixels:
            self.limits.release(pixels)

    def _score(self, batch: list[Job]) -> None:
        prompts = [p for job in batch for p in job.prompts]
        if len(batch) == 1:
            outputs: Any = batch[0].outputs  # a merge copies: not for one request
        elif isinstance(batch[0].outputs, torch.Tensor):
            outputs = torch.cat([job.outputs for job in batch])
        else:
            outputs = [t for job in batch for t in job.outputs]
        for job in batch:  # the merged copy is the one to keep: halves the peak of a merge
            job.outputs = None
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
        except Exception:  # logged here; its clients only learn the request id
            ids = ", ".join(job.request_id for job in batch)
            logger.exception("reward %r failed on requests %s", self.reward.name, ids)
            for job in batch:
                job.failed = True
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


__all__ = ["RewardServer"]
