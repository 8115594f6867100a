"""The scoring side of the reward server (``server.py``): one worker thread per model replica.

Each ``Replica`` owns one reward model instance (on its own device) and one queue. Its worker
takes the next request and merges queued requests of the same kind and image size into batches
of up to ``max_batch_size`` samples within ``batch_wait_s``, scores each batch with one call and
hands every request its own rows back. The HTTP front (``asgi.py``) only decodes requests and
waits for them; ``Replicas.dispatch`` sends each request to the replica with the fewest samples
queued or being scored, so that several replicas behind one endpoint share the load while one
replica still merges whatever queues up behind it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

import torch

from reward_models.base import RewardModel
from reward_models.serving.requests import DecodeLimits, Job, RequestError
from reward_models.wire import VERSION, encode_scores

logger = logging.getLogger("reward_models.serving.server")


class Replica:
    """One reward model instance and the worker thread that scores its queue.

    Args:
        reward: this replica's model (not shared with another replica: each worker calls its
            own instance, so no model is used from two threads).
        index: its position among the server's replicas (logs, tests).
        limits: the server-wide decoding limits; merges take their copy from its pixel budget.
        max_batch_size: samples per reward call.
        batch_wait_s: how long the worker waits for more requests to merge.
        record: a server-wide list every replica appends its batch sizes to.
        load_lock: the dispatcher's lock, held while ``load`` changes.
    """

    def __init__(
        self,
        reward: RewardModel,
        index: int,
        limits: DecodeLimits,
        max_batch_size: int,
        batch_wait_s: float,
        record: list[int],
        load_lock: threading.Lock,
    ) -> None:
        self.reward = reward
        self.index = index
        self.limits = limits
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.load = 0  # samples dispatched here and not finished yet
        self.batch_sizes: list[int] = []  # this replica's reward calls
        self._record = record
        self._load_lock = load_lock
        self._worker = threading.Thread(
            target=self._score_loop, daemon=True, name=f"reward-replica-{index}"
        )

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self.jobs.put(None)

    def _score_loop(self) -> None:
        pending: list[Job] = []
        while True:
            job = pending.pop(0) if pending else self.jobs.get()
            if job is None:
                return
            if job.abandoned:  # a retry of it may already be queued
                self._finish(job)
                continue
            batch, size, merge_pixels = [job], len(job), 0
            deadline = time.monotonic() + self.batch_wait_s
            while size < self.max_batch_size:
                try:
                    other = self.jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if other is None:
                    self.jobs.put(None)
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
        """Drop a job's outputs, give its pixels back to the budget and its samples back to
        this replica's load (once per job: every job leaves the queue exactly once)."""
        job.outputs = None
        pixels, job.pixels = job.pixels, 0
        if pixels:
            self.limits.release(pixels)
        with self._load_lock:
            self.load -= len(job)

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
            scores, applicable = self._call(outputs, prompts, metadata)
        except Exception:  # logged here; its clients only learn the request id
            ids = ", ".join(job.request_id for job in batch)
            logger.exception(
                "reward %r (replica %d) failed on requests %s", self.reward.name, self.index, ids
            )
            for job in batch:
                job.failed = True
                job.complete()
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
            job.complete()

    def _call(
        self, outputs: Any, prompts: list[str], metadata: list[dict[str, Any]] | None
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Scores of a merged batch, in reward calls of at most ``max_batch_size`` samples."""
        chunks = []
        for start in range(0, len(prompts), self.max_batch_size):
            stop = start + self.max_batch_size
            self.batch_sizes.append(len(prompts[start:stop]))
            self._record.append(len(prompts[start:stop]))
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
        return scores, applicable


class Replicas:
    """The server's replicas and the least-loaded dispatch among them."""

    def __init__(
        self,
        rewards: Sequence[RewardModel],
        limits: DecodeLimits,
        max_batch_size: int,
        batch_wait_s: float,
    ) -> None:
        check_replicas(rewards)
        self.batch_sizes: list[int] = []  # every replica's reward calls, for tests and logs
        self.stopped = False
        self._lock = threading.Lock()
        self.members = [
            Replica(r, i, limits, max_batch_size, batch_wait_s, self.batch_sizes, self._lock)
            for i, r in enumerate(rewards)
        ]

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int) -> Replica:
        return self.members[index]

    def start(self) -> None:
        for replica in self.members:
            replica.start()

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
        for replica in self.members:
            replica.stop()

    def dispatch(self, job: Job) -> Replica:
        """Queue ``job`` on the replica with the fewest samples in flight (the first of equals,
        so that one client's sequential requests stay on one warm replica). Raises
        ``RequestError`` 503 once the workers are stopped (the server is shutting down)."""
        with self._lock:
            if self.stopped:
                self._refuse(job)
            replica = min(self.members, key=lambda r: (r.load, r.index))
            replica.load += len(job)
        replica.jobs.put(job)
        return replica

    def _refuse(self, job: Job) -> None:
        pixels, job.pixels, job.outputs = job.pixels, 0, None
        if pixels:
            self.members[0].limits.release(pixels)
        raise RequestError(
            HTTPStatus.SERVICE_UNAVAILABLE,
            "the reward server is shutting down; retry later",
            {"Retry-After": "1"},
        )


def check_replicas(rewards: Sequence[RewardModel]) -> None:
    """Replicas must be distinct instances of one reward: same name, same accepted kinds."""
    if not rewards:
        raise ValueError("a reward server needs at least one reward model (replicas >= 1)")
    first = rewards[0]
    if len({id(r) for r in rewards}) != len(rewards):
        raise ValueError(
            "replicas must be distinct model instances (one per device); the same object was "
            "given twice, and two workers would call it at once"
        )
    for index, reward in enumerate(rewards[1:], start=1):
        if reward.name != first.name or tuple(reward.accepts) != tuple(first.accepts):
            raise ValueError(
                f"replica {index} is reward {reward.name!r} accepting {list(reward.accepts)}, "
                f"replica 0 is {first.name!r} accepting {list(first.accepts)}: replicas must "
                "be copies of one reward"
            )


__all__ = ["Replica", "Replicas", "check_replicas"]
