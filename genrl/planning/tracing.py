"""Memory and FLOPs of one forward (and backward) of a module, on fake tensors.

``LiveBytes`` is a ``TorchDispatchMode`` that sees every tensor an operator returns and counts
the bytes of its storage until the storage is freed (a weak reference's callback), so its peak
is the peak of memory the step allocated. It is also what ``tests/test_planning.py`` compares
with on real CPU tensors. torch's ``MemTracker`` (``torch.distributed._tools``) does the same
with module hooks and categories, but costs ~25x a plain fake step on a 2B transformer (74 s
against 3 s, measured), too slow for the planner's budget.

The FLOPs are counted in the same pass with the formulas of ``torch.utils.flop_counter``
(matmuls, convolutions and attention: the operators that dominate a transformer; elementwise
work is not counted), plus CPU's fused attention, which its table lacks (the fake tensors here
live on the CPU). ``FlopCounterMode`` itself is not used: its module tracker keeps the
activations alive until the step ends (measured: a 12 GiB peak read as 66 GiB).
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten
FLOP_FORMULAS = {
    **flop_registry,
    # Same arguments as the CUDA flash kernels: (query, key, value, ...) and
    # (grad_out, query, key, value, ...).
    aten._scaled_dot_product_flash_attention_for_cpu: flop_registry[
        aten._scaled_dot_product_flash_attention
    ],
    aten._scaled_dot_product_flash_attention_for_cpu_backward: flop_registry[
        aten._scaled_dot_product_flash_attention_backward
    ],
}


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of live storages created while active, as an event log: each storage
    gets an id, ``events`` is ``(id, +bytes)`` at creation and ``(id, -bytes)`` when freed.
    ``peak(excluding)`` replays the log without some storages (the gradients, counted apart).
    ``flops`` sums the FLOPs of the operators run."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0
        self.events: list[tuple[int, int]] = []
        self._ids = itertools.count()
        self._live: dict[int, int] = {}  # storage address key -> event id

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = FLOP_FORMULAS.get(func._overloadpacket)
        if formula is not None:
            self.flops += int(formula(*args, **kwargs, out_val=out))
        # A view or an in-place result shares an input's storage: nothing new was allocated
        # (counting it would count a weight each time it is transposed for a matmul).
        inputs = {
            t.untyped_storage()._cdata
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.untyped_storage()._cdata not in inputs:
                self._track(leaf)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._live:
            return  # a view of a storage already counted
        uid = next(self._ids)
        size = storage.nbytes()
        self._live[key] = uid
        self.events.append((uid, size))
        weakref.finalize(storage, self._free, key, uid, size)

    def _free(self, key: int, uid: int, size: int) -> None:
        if self._live.get(key) == uid:
            del self._live[key]
        self.events.append((uid, -size))

    def storage_id(self, tensor: torch.Tensor) -> int | None:
        """The event id of the live storage behind ``tensor`` (None if not made here)."""
        return self._live.get(tensor.untyped_storage()._cdata)

    def peak(self, excluding: set[int] | frozenset[int] = frozenset()) -> int:
        live = best = 0
        for uid, delta in self.events:
            if uid in excluding:
                continue
            live += delta
            best = max(best, live)
        return best


@dataclass(frozen=True)
class Trace:
    """One traced step: the peak bytes it allocated beyond what existed before (gradients
    excluded: the planner counts them apart), the bytes of the gradients it left, and its FLOPs
    (forward and, when traced, backward)."""

    peak_bytes: int
    gradient_bytes: int
    flops: int


def trace(step: Callable[[], torch.Tensor | None], module: torch.nn.Module | None = None) -> Trace:
    """Run ``step`` (a forward, or a forward and ``backward``) under the trackers. Gradients it
    leaves on ``module``'s parameters are counted in ``gradient_bytes`` and left out of the peak
    (and then dropped). Runs inside whatever tensor mode the caller entered (fake or real)."""
    live = LiveBytes()
    with live:
        out = step()
        del out
    grads: set[int] = set()
    gradient_bytes = 0
    if module is not None:
        for p in module.parameters():
            if p.grad is not None:
                uid = live.storage_id(p.grad)
                if uid is not None:
                    grads.add(uid)
                gradient_bytes += p.grad.numel() * p.grad.element_size()
                p.grad = None
    return Trace(live.peak(grads), gradient_bytes, live.flops)


@contextlib.contextmanager
def autocast(dtype: torch.dtype | None) -> Iterator[None]:
    """CPU autocast to ``dtype`` (the recipe's ``train.mixed_precision``), or nothing. On a GPU
    the same casts happen under CUDA autocast; the fake tensors here live on the CPU."""
    if dtype is None:
        yield
        return
    with torch.autocast("cpu", dtype=dtype):
        yield
