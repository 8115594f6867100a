"""The scoring side of the reward server (``server.py``): one worker thread per model replica.

Each ``Replica`` owns one reward model instance (on its own device) and one queue. Its worker
takes the next request and merges queued requests of the same kind and image size into batches
of up to ``max_batch_size`` samples within ``batch_wait_s``, scores each batch with one call
(``scoring.py``) and hands every request its own rows back. The HTTP front (``asgi.py``) only
decodes requests and waits for them; ``Replicas.dispatch`` sends each request to the replica in
rotation with the fewest samples queued or being scored, so that several replicas behind one
endpoint share the load while one replica still merges whatever queues up behind it.

Failover: a replica whose reward call raises (anything but a ``RewardInputError``, which is the
request's fault) is taken out of rotation, unless it is the last one in rotation, and each job
of the failed call is sent once to a replica in rotation; a job that fails a second time gets
500. A replica out of rotation sends on what is still queued on it and scores nothing more.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from reward_models.base import RewardModel
from reward_models.logs import install
from reward_models.serving.jobs import Job, one_line
from reward_models.serving.requests import DecodeLimits, RequestError
from reward_models.serving.scoring import score_batch

logger = install(logging.getLogger("reward_models.serving.server"))  # tracebacks clipped


class Replica:
    """One reward model instance and the worker thread that scores its queue.

    Args:
        reward: this replica's model (not shared with another replica: each worker calls its
            own instance, so no model is used from two threads).
        index: its position among the server's replicas (logs, tests).
        limits: the server-wide decoding limits; merges take their copy from its pixel budget.
        max_batch_size: samples per reward call.
        batch_wait_s: how long the worker waits for more requests to merge.
        pool: the server's replicas, which dispatch to it and take over its failed jobs.
    """

    def __init__(
        self,
        reward: RewardModel,
        index: int,
        limits: DecodeLimits,
        max_batch_size: int,
        batch_wait_s: float,
        pool: Replicas,
    ) -> None:
        self.reward = reward
        self.index = index
        self.limits = limits
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.load = 0  # samples dispatched here and not finished yet
        self.batch_sizes: list[int] = []  # this replica's reward calls
        self.in_rotation = True  # False once taken out after a failed call
        self.failed_calls = 0
        self.last_error: str | None = None  # one line: the exception type and message
        self._pool = pool
        self._worker = threading.Thread(
            target=self._score_loop, daemon=True, name=f"reward-replica-{index}"
        )

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self.jobs.put(None)

    def health(self) -> dict[str, Any]:
        """This replica's entry in ``GET /health``."""
        return {
            "replica": self.index,
            "state": "healthy" if self.in_rotation else "out of rotation",
            "failed_calls": self.failed_calls,
            "last_error": self.last_error,
        }

    def _score_loop(self) -> None:
        pending: list[Job] = []
        while True:
            job = pending.pop(0) if pending else self.jobs.get()
            if job is None:
                return
            if job.abandoned:  # a retry of it may already be queued
                self._finish(job)
                continue
            if not self.in_rotation and self._pool.move(job, self):
                continue  # queued here before this replica was taken out: sent on, unscored
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
                extra = other.decoded_pixels + (job.decoded_pixels if len(batch) == 1 else 0)
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
                if merge_pixels:
                    self.limits.release(merge_pixels)

    def _score(self, batch: list[Job]) -> None:
        moved: list[Job] = []
        try:
            error = score_batch(self.reward, batch, self._record)
            if error is not None:
                moved = self._failed(batch, error)
        finally:  # every job leaves this replica exactly once: finished here, or moved on
            for job in batch:
                if job in moved:
                    continue
                if job.result is None and job.refusal is None:
                    job.failed = True
                self._finish(job)
                job.complete()

    def _failed(self, batch: list[Job], error: Exception) -> list[Job]:
        """Log a failed call and fail its unscored jobs over; the jobs moved elsewhere."""
        unscored = [job for job in batch if job.result is None and job.refusal is None]
        ids = ", ".join(job.request_id for job in unscored)
        logger.error(
            "reward %r (replica %d) failed on requests %s",
            self.reward.name,
            self.index,
            ids,
            exc_info=error,
        )
        return self._pool.fail_over(self, unscored, error)

    def _record(self, size: int) -> None:
        self.batch_sizes.append(size)
        self._pool.batch_sizes.append(size)

    def _finish(self, job: Job) -> None:
        """Drop a job's outputs, give its pixels back to the budget and its samples back to
        this replica's load (once per job: every job leaves the queue exactly once)."""
        job.outputs = None
        pixels, job.pixels = job.pixels, 0
        if pixels:
            self.limits.release(pixels)
        with self._pool.lock:
            self.load -= len(job)


class Replicas:
    """The server's replicas, the least-loaded dispatch among those in rotation, failover."""

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
        self.lock = threading.Lock()  # held while loads and the rotation change
        self.limits = limits
        self.members = [
            Replica(r, i, limits, max_batch_size, batch_wait_s, self) for i, r in enumerate(rewards)
        ]

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int) -> Replica:
        return self.members[index]

    def start(self) -> None:
        for replica in self.members:
            replica.start()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
        for replica in self.members:
            replica.stop()

    def health(self) -> list[dict[str, Any]]:
        with self.lock:
            return [replica.health() for replica in self.members]

    def dispatch(self, jobs: Sequence[Job]) -> None:
        """Queue each job on the replica in rotation with the fewest samples in flight (the
        first of equals, so that one client's sequential requests stay on one warm replica).
        Raises ``RequestError`` 503 once the workers are stopped (the server is shutting
        down), giving back the pixels of the jobs not queued."""
        for index, job in enumerate(jobs):
            with self.lock:
                if self.stopped:
                    self._refuse(jobs[index:])
                replica = self._least_loaded(None)
                assert replica is not None  # the last replica in rotation is never taken out
                replica.load += len(job)
            replica.jobs.put(job)

    def move(self, job: Job, source: Replica) -> bool:
        """Send a job queued on ``source`` (out of rotation) to a replica in rotation, not as
        a retry: ``source`` never tried it. False if there is none (the server is stopping)."""
        with self.lock:
            target = None if self.stopped else self._least_loaded(source)
            if target is None:
                return False
            source.load -= len(job)
            target.load += len(job)
        target.jobs.put(job)
        return True

    def fail_over(self, source: Replica, jobs: list[Job], error: Exception) -> list[Job]:
        """After ``source``'s call raised ``error`` on ``jobs``: take ``source`` out of
        rotation unless it is the last replica in it (a server with none would refuse every
        request, and a lone replica keeps failing one request at a time), or unless every job
        has failed elsewhere before (then the requests are at fault, not the replica). Each job
        not retried yet is sent to a replica in rotation; the jobs sent are returned."""
        line = f"{type(error).__name__}: {one_line(error)}"
        moved: list[Job] = []
        with self.lock:
            source.failed_calls += 1
            source.last_error = line
            others = [r for r in self.members if r.in_rotation and r is not source]
            if others and source.in_rotation and any(not job.retried for job in jobs):
                source.in_rotation = False
            for job in jobs:
                target = self._least_loaded(source)
                if self.stopped or target is None or job.retried or job.abandoned:
                    continue
                job.retried = True
                source.load -= len(job)
                target.load += len(job)
                target.jobs.put(job)
                moved.append(job)
            out = not source.in_rotation
        if out:
            logger.warning(
                "replica %d of reward %r is out of rotation after %s; %d request(s) retried "
                "on the other replicas",
                source.index,
                source.reward.name,
                line,
                len(moved),
            )
        return moved

    def _least_loaded(self, besides: Replica | None) -> Replica | None:
        """The replica in rotation (other than ``besides``) with the fewest samples in
        flight; None if there is none. Called with the lock held."""
        candidates = [r for r in self.members if r.in_rotation and r is not besides]
        return min(candidates, key=lambda r: (r.load, r.index)) if candidates else None

    def _refuse(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            pixels, job.pixels, job.outputs = job.pixels, 0, None
            if pixels:
                self.limits.release(pixels)
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
