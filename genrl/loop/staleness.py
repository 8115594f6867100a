"""Asynchronous rollouts with bounded staleness (``train.max_staleness=K``).

With ``K = 0`` (the default) iteration ``i`` samples from the weights its update starts from,
and nothing here runs. With ``K >= 1`` the rollout of iteration ``i + 1`` is sampled in a
background thread while iteration ``i`` computes its units and updates, from the weights the
policy had ``K`` iterations before: iteration ``j`` samples from *version* ``max(0, j - K)``
(version ``v``: the weights after ``v`` iterations' updates). The lag is exactly ``K`` rather
than "whatever was newest when the thread started", so that a run is a function of its seed and
``K`` alone: scheduling (which thread ran first, how long a reward took) never changes a sample,
and a resumed run reproduces an uninterrupted one. The price: the bound is always reached, even
when newer weights were ready (a documented choice; other asynchronous trainers' rules were not
read for this module).

What runs in the thread is phases 1-2 only (prompts, sampling). Rewards, a stateful reward's
``update`` and advantages (phases 3-4) run in the trainer's thread when the batch is consumed,
so a batch in flight when a run is interrupted holds nothing a checkpoint must keep: the resumed
run samples it again from the stored versions. The sampling copy is a second policy object whose
frozen tensors (the base model under LoRA, buffers) are the trainer's own, and whose trained
tensors are loaded from the version it must sample from; an inference engine that keeps its own
weights (``generation.engine=vllm``) is synced to that version too.

The update then compares against the trainer's own old log-probs (recomputed before the update,
as always), while the tokens came from a policy ``K`` updates older: the engine's log-probs are
the behaviour policy's. ``loss/mismatch_*`` measure the gap and ``algorithm.tis_cap`` corrects
it by truncated importance sampling (``genrl/objectives/mismatch.py``, after verl's rollout
correction).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch


def version_for(iteration: int, max_staleness: int) -> int:
    """The weights version iteration ``iteration`` samples from: ``max(0, iteration - K)``."""
    return max(0, iteration - max_staleness)


def sampling_copy(policy: Any) -> Any:
    """A second policy object for the sampling thread: the trained tensors are its own, every
    other tensor (frozen base weights, buffers, a frozen reference) is shared with ``policy``.
    Its ``module`` is the unwrapped network, in eval mode."""
    network = policy.network
    shared: dict[int, Any] = {}
    for tensor in [*network.parameters(), *network.buffers()]:
        if not tensor.requires_grad:
            shared[id(tensor)] = tensor
    reference = getattr(policy, "_frozen_reference", None)
    if reference is not None:
        shared[id(reference)] = reference
    if policy.module is not network:  # an accelerate wrapper: not copied, not used to sample
        shared[id(policy.module)] = network
    clone = copy.deepcopy(policy, memo=shared)
    clone.module = clone.network
    clone.network.eval()
    for param in clone.network.parameters():
        param.requires_grad_(False)  # nothing differentiates through the sampling copy
    return clone


def trained_tensors(policy: Any) -> dict[str, torch.Tensor]:
    """Copies of the trained parameters, on their device (one weights version)."""
    return {
        name: param.detach().clone()
        for name, param in policy.network.named_parameters()
        if param.requires_grad
    }


class StaleSampler:
    """Samples iteration ``j``'s batch from version ``max(0, j - K)`` in a background thread.

    Args:
        policy: the trainer's policy (its trained tensors are read after every update).
        max_staleness: ``K >= 1``.
        sample: ``(sampling_policy, iteration) -> sampled round`` (phases 1-2), called in the
            thread.
        sync_engine: ``(sampling_policy) -> seconds | None``: make an inference engine that keeps
            its own weights sample from the sampling copy's (the rollout's ``sync_weights``).

    The trainer calls ``take(i)`` for iteration ``i``'s sampled round (sampling it now if none
    is in flight), ``start(i + 1)`` right after, and ``record(i + 1)`` after the update that
    produced version ``i + 1``. ``versions`` holds the ones a later iteration still needs.
    """

    def __init__(
        self,
        policy: Any,
        max_staleness: int,
        sample: Callable[[Any, int], Any],
        sync_engine: Callable[[Any], float | None],
    ) -> None:
        if max_staleness < 1:
            raise ValueError(f"StaleSampler needs max_staleness >= 1, got {max_staleness}")
        self.policy = policy
        self.max_staleness = max_staleness
        self.sample = sample
        self.sync_engine = sync_engine
        self.copy = sampling_copy(policy)
        self.versions: dict[int, dict[str, torch.Tensor]] = {0: trained_tensors(policy)}
        self._loaded: int | None = None  # the version the copy holds now
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="genrl-rollout")
        self._pending: tuple[int, Future[Any]] | None = None
        self._lock = threading.Lock()
        self.last_sync_s: float | None = None

    # -- the thread's work ----------------------------------------------------------------------
    def _load(self, version: int) -> None:
        """Put ``version``'s trained tensors into the sampling copy (and its engine)."""
        if self._loaded == version:
            return
        params = dict(self.copy.network.named_parameters())
        with torch.no_grad():
            for name, value in self.versions[version].items():
                params[name].copy_(value)
        self._loaded = version
        self.last_sync_s = self.sync_engine(self.copy)

    def _run(self, iteration: int) -> Any:
        with self._lock:
            self._load(version_for(iteration, self.max_staleness))
            return self.sample(self.copy, iteration)

    # -- the trainer's calls --------------------------------------------------------------------
    def start(self, iteration: int) -> None:
        """Begin sampling ``iteration``'s round in the background (its version must exist)."""
        version = version_for(iteration, self.max_staleness)
        if version not in self.versions:
            raise RuntimeError(f"weights version {version} for iteration {iteration} is gone")
        if self._pending is not None:
            raise RuntimeError("a sampled round is already in flight")
        self._pending = (iteration, self._pool.submit(self._run, iteration))

    def take(self, iteration: int) -> Any:
        """Iteration ``iteration``'s sampled round; sampled here when no round for it is in
        flight (the first iteration, or after a resume)."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == iteration:
            return pending[1].result()
        if pending is not None:
            pending[1].result()  # a round for another iteration: let it finish, then drop it
        return self._run(iteration)

    def record(self, version: int) -> None:
        """Keep the weights after ``version`` iterations; drop those no later iteration reads.
        Iteration ``version`` itself may still sample (after a resume, no round is in flight),
        so its version stays: ``K + 1`` versions are kept."""
        self.versions[version] = trained_tensors(self.policy)
        oldest_needed = version_for(version, self.max_staleness)
        for old in [v for v in self.versions if v < oldest_needed]:
            del self.versions[old]

    def discard(self) -> None:
        """Wait for a round in flight and drop it (before a checkpoint is read back, at the
        end). An error it raised is dropped with it: the round is sampled again, and raises
        again, if a resumed run needs it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[1].exception()

    def close(self) -> None:
        self.discard()
        self._pool.shutdown(wait=True)

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The versions a later iteration still samples from (on the CPU)."""
        return {
            str(v): {n: t.detach().cpu() for n, t in tensors.items()}
            for v, tensors in self.versions.items()
        }

    def load_state_dict(self, state: dict[str, Any], iteration: int) -> None:
        """Restore the stored versions; the newest, ``iteration``, is the policy's own."""
        self.discard()
        device = self.policy.device
        self.versions = {
            int(v): {n: t.to(device) for n, t in tensors.items()} for v, tensors in state.items()
        }
        self.versions[iteration] = trained_tensors(self.policy)
        self._loaded = None


__all__ = ["StaleSampler", "sampling_copy", "trained_tensors", "version_for"]
