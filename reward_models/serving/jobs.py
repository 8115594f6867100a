"""Jobs of the reward server: a request on its way to a scoring worker, and its outcome.

A request of more samples than ``max_batch_size`` is admitted as several part jobs of at most
that many (``joined``), each scored, merged with other requests and failed over on its own, so
that every sample is scored by exactly one successful reward call; the request's reply is the
parts' rows joined in order once the last part is done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(eq=False)  # identity: a job is one request's, however alike two are
class Job:
    """A request (or part of one) on its way to a scoring worker, and its outcome."""

    request_id: str
    prompts: list[str]
    outputs: Any
    metadata: list[dict[str, Any]] | None
    pixels: int = 0  # taken from the server's pixel budget until the job is finished
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Any] | None = None
    refusal: str | None = None  # the reward's RewardInputError: the client's 422
    failed: bool = False  # the reward raised something else (logged under the request id)
    retried: bool = False  # failed on one replica and sent to another: never again
    abandoned: bool = False  # its client got a 504: not worth scoring any more
    # Called from the scoring thread once the job is scored or failed: how an asyncio front
    # learns of it without parking a thread on ``done``.
    callbacks: list[Callable[[], None]] = field(default_factory=list)
    parts: list[Job] = field(default_factory=list)  # a request split by ``joined``

    def __len__(self) -> int:
        return len(self.prompts)

    def complete(self) -> None:
        """Mark the job scored (or failed) and tell whoever waits for it."""
        self.done.set()
        for callback in self.callbacks:
            callback()

    def abandon(self) -> None:
        """Nobody waits for the outcome any more: its workers drop it (and its parts)."""
        self.abandoned = True
        for part in self.parts:
            part.abandoned = True

    def key(self) -> tuple:
        """Jobs with equal keys can share a batch (same kind, same image size)."""
        if isinstance(self.outputs, torch.Tensor):
            return ("videos" if self.outputs.ndim == 5 else "images", *self.outputs.shape[1:])
        return ("texts",)

    @property
    def decoded_pixels(self) -> int:
        """Pixels of the job's decoded images (all frames of its videos), 0 for texts."""
        if isinstance(self.outputs, torch.Tensor):
            return self.outputs.numel() // self.outputs.shape[-3]
        return 0


def joined(request_id: str, parts: list[Job]) -> Job:
    """The job of a whole request scored as ``parts``: it completes once the last part has,
    with their rows in order, the first part's refusal (its rows named), or failed."""
    whole = Job(request_id, [p for part in parts for p in part.prompts], None, None)
    whole.parts = parts
    left, lock = [len(parts)], threading.Lock()

    def part_done() -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        _join(whole)
        whole.complete()

    for part in parts:
        part.callbacks.append(part_done)
    return whole


def _join(whole: Job) -> None:
    start = 0
    for part in whole.parts:
        if part.refusal is not None:  # the client must fix its request whatever else happened
            whole.refusal = f"samples {start}-{start + len(part) - 1}: {part.refusal}"
            return
        start += len(part)
    if any(part.result is None for part in whole.parts):
        whole.failed = True
        return
    results = [part.result for part in whole.parts if part.result is not None]
    scores: dict[str, list[Any]] = {}
    applicable: dict[str, list[bool]] = {}
    for name in dict.fromkeys(k for r in results for k in r["scores"]):
        # A score missing from a part is "not computed" there: null, as NaN travels.
        scores[name] = [v for p, r in zip(whole.parts, results, strict=True)
                        for v in r["scores"].get(name, [None] * len(p))]  # fmt: skip
    for name in dict.fromkeys(k for r in results for k in r["applicable"]):
        # The wire format's missing "applicable" means applicable everywhere.
        applicable[name] = [v for p, r in zip(whole.parts, results, strict=True)
                            for v in r["applicable"].get(name, [True] * len(p))]  # fmt: skip
    first = results[0]
    whole.result = {**first, "scores": scores, "applicable": applicable}


def internal_error(request_id: str) -> str:
    """The message of a 500: the details stay in the server log, under the request id."""
    return f"internal error; the server log has the details under request id {request_id}"


def one_line(error: BaseException, limit: int = 300) -> str:
    """An exception as one line of at most ``limit`` characters (a 422 body, ``/health``)."""
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


__all__ = ["Job", "internal_error", "joined", "one_line"]
