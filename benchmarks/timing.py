"""Measuring helpers shared by the benchmarks: mixed precision as the trainer uses it, device
synchronisation, interleaved repeated timing, and a per-phase profiler."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """The trainer's mixed precision: autocast to the frozen weights' dtype (off for float32)."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[dtype])


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that wall-clock timings cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    methods: dict[str, Callable[[int], torch.Tensor]], repeats: int, warmup: int
) -> dict[str, list[float]]:
    """Seconds per call of each method; the order alternates every repeat to cancel drift.
    Each call gets the repeat index and must return a finite tensor."""
    names = list(methods)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            out = methods[name](r)
            elapsed = time.perf_counter() - start
            if not bool(torch.isfinite(out.float()).all()):
                raise RuntimeError(f"{name} produced non-finite output")
            if r >= warmup:
                times[name].append(elapsed)
    return times


class PhaseTimer:
    """Wall time spent inside wrapped callables and properties, restored on exit. On a GPU each
    timed call synchronises before and after, so phases show where time goes, not overlap."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._restore: list[tuple[Any, str, Any]] = []

    def _timed(
        self, function: Callable[..., Any], phase: str | Callable[[], str]
    ) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            name = phase if isinstance(phase, str) else phase()
            synchronize(self.device)
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                synchronize(self.device)
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
                self.calls[name] = self.calls.get(name, 0) + 1

        return timed

    def wrap(self, owner: Any, attribute: str, phase: str | Callable[[], str]) -> None:
        """Time ``owner.attribute(...)`` (a method or function attribute of an instance);
        ``phase`` may be a function, asked at each call (e.g. to tell no-grad calls apart)."""
        own = vars(owner).get(attribute)
        self._restore.append((owner, attribute, own))
        setattr(owner, attribute, self._timed(getattr(owner, attribute), phase))

    def wrap_property(self, cls: type, attribute: str, phase: str) -> None:
        """Time reads of the property ``cls.attribute`` on every instance of ``cls``."""
        original = inspect.getattr_static(cls, attribute)
        self._restore.append((cls, attribute, vars(cls).get(attribute)))
        setattr(cls, attribute, property(self._timed(original.fget, phase)))

    @contextlib.contextmanager
    def installed(self) -> Iterator[PhaseTimer]:
        try:
            yield self
        finally:
            for owner, attribute, own in reversed(self._restore):
                if own is None:
                    delattr(owner, attribute)
                else:
                    setattr(owner, attribute, own)
            self._restore.clear()
