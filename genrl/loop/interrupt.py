"""Ctrl-C that stops a run cleanly: the first press asks the loop to stop after the current
iteration (which then ends in a checkpoint); a second press aborts at once."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch


class StopRequest:
    """A flag the loop polls at iteration boundaries, agreed across processes."""

    def __init__(self) -> None:
        self.requested = False

    @contextlib.contextmanager
    def handle_sigint(self, announce: Callable[[str], None]) -> Iterator[None]:
        """Install the two-stage SIGINT handler for the duration of the block (main thread
        only; elsewhere signals cannot be handled and the block runs unchanged)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGINT)

        def on_sigint(signum: int, frame: Any) -> None:
            if self.requested:
                signal.signal(signal.SIGINT, previous)
                raise KeyboardInterrupt
            self.requested = True
            announce("Ctrl-C: stopping after this iteration and saving a checkpoint "
                     "(press again to abort without saving)")  # fmt: skip

        signal.signal(signal.SIGINT, on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def agreed(self, accelerator: Any) -> bool:
        """True when any process was asked to stop (all processes then stop together)."""
        if accelerator.num_processes == 1:
            return self.requested
        flag = torch.tensor([float(self.requested)], device=accelerator.device)
        return bool(accelerator.reduce(flag, reduction="sum").item() > 0)
