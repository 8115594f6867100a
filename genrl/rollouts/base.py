"""The rollout contract: how a process's samples are made (phase 2 of the loop).

A rollout samples with no gradients and records what training needs (flow: every state and
step log-prob; trees: the edges; endpoints: clean samples; tokens: ids and masks). It also
decodes its samples for the rewards, names the extra reward columns, makes the held-out outputs
of evaluation, and keeps any state that must survive a resume (a lagged copy of the policy).
It knows no loss: that is the objective's (``genrl/objectives/base.py``).

``stream`` is ``collect`` in chunks: it yields each chunk of samples as soon as it is sampled,
so that the collector can score one chunk while the next is sampled (``train.overlap_rewards``,
``genrl/loop/reward_overlap.py``). The default yields the whole batch once ``collect`` returns, which
is right for rollouts whose chunks cannot be sampled one after the other without changing the
samples: trees (BranchGRPO needs every leaf of a tree) and token rollouts (one generator draws
for the whole batch).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from genrl.data.batches import Batch
from genrl.data.rng import RolloutNoise
from genrl.policies.protocols import Policy

P = TypeVar("P", bound=Policy)
B = TypeVar("B", bound=Batch)

# (prompts of a chunk, their sample indices in the held-out layout) -> decoded outputs
OutputFn = Callable[[list[str], slice], Any]


@dataclass
class Chunk(Generic[B]):
    """Samples of a rollout that are complete before the rest of the batch is.

    Attributes:
        rows: their rows in the process's batch (consecutive chunks tile it in order).
        batch: those samples, as ``batch.select(rows)`` of the finished batch would hold them;
            ``Rollout.outputs`` and ``Rollout.reward_metadata`` read it.
    """

    rows: slice
    batch: B


# Yields the chunks in order, then returns the finished batch (what ``collect`` returns).
ChunkStream = Generator[Chunk[B], None, B]


def chunk_rows(num_samples: int, size: int) -> list[slice]:
    """Consecutive slices of ``size`` rows covering ``num_samples`` (one when ``size`` is 0)."""
    size = size or num_samples
    return [slice(i, min(i + size, num_samples)) for i in range(0, num_samples, size)]


class Rollout(abc.ABC, Generic[P, B]):
    """Base of every rollout; built once per run by its algorithm, after the policy. ``P`` is
    the policy protocol it samples from (``genrl/policies/protocols.py``), ``B`` the batch it makes."""

    supports_staleness: bool = False
    """Whether its batches keep the sampler's log-probs, so that a rollout sampled from older
    weights (``train.max_staleness``, ``genrl/loop/staleness.py``) can be measured and corrected
    by the objective; the token rollouts do."""

    @property
    def uses_reference(self) -> bool:
        """Whether sampling enters ``policy.reference()`` (e.g. a per-step KL measured while
        sampling); see ``Objective.uses_reference``."""
        return False

    @abc.abstractmethod
    def collect(
        self, policy: P, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> B:
        """This process's samples of ``prompts`` (their ``group_ids``), with no gradients."""

    def chunks(self, num_samples: int) -> list[slice]:
        """The rows of the chunks ``stream`` yields, which are also the batches the rewards
        score in both orders (so that a reward whose value depends on its batch, e.g. through
        padding or a BLAS kernel chosen by batch size, scores the same either way). Default:
        the whole batch."""
        return [slice(0, num_samples)]

    def stream(
        self, policy: P, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> ChunkStream[B]:
        """``collect`` chunk by chunk: yield a ``Chunk`` for each of ``chunks(len(prompts))``
        once its samples are final, then return the whole batch, equal to what ``collect``
        returns for the same arguments. The caller holds ``torch.no_grad()`` while it advances
        the generator. Default: the whole batch as one chunk, after ``collect``."""
        batch = self.collect(policy, prompts, group_ids, noise)
        yield Chunk(slice(0, len(prompts)), batch)
        return batch

    @abc.abstractmethod
    def outputs(self, policy: P, batch: B) -> Any:
        """Decoded outputs for the reward models (images ``[N, C, H, W]`` or texts)."""

    def reward_metadata(self, batch: B) -> list[dict[str, Any]] | None:
        """Per-sample extras for the reward models (TRL's ``**columns``); None when none."""
        del batch
        return None

    @abc.abstractmethod
    def evaluation_outputs(
        self, policy: P, prompts: list[str], samples_per_prompt: int, seed: int
    ) -> OutputFn:
        """How held-out outputs are made: deterministic (or fixed-seed) samples of chunks of the
        held-out layout, where sample ``i`` belongs to ``prompts[i % len(prompts)]``."""

    def evaluation_sampling(self) -> str:
        """How ``evaluation_outputs`` samples, in a few words for the run's held-out protocol
        (``genrl/prompts/heldout.py``): e.g. "a deterministic ODE sampler, 10 steps"."""
        return f"{type(self).__name__}'s held-out sampler"

    def from_stored(
        self, policy: P, prompts: list[str], group_ids: torch.Tensor, samples: torch.Tensor
    ) -> B:
        """A batch of clean ``samples`` read from an offline store (``train.offline_store``),
        for rollouts whose objective needs nothing else; ``Algorithm.supports_offline`` says
        which do, and the config refuses the others before this is reached."""
        del policy, prompts, group_ids, samples
        raise TypeError(f"{type(self).__name__} cannot train from stored samples")

    def sync_weights(self, policy: P) -> float | None:
        """Called after each iteration's optimizer steps: make whatever samples the next
        rollout hold the policy's new weights (an inference engine's copy); returns the seconds
        it took, or None when the rollout samples from the policy itself (the default)."""
        del policy
        return None

    def describe(self) -> dict[str, Any]:
        """How this rollout samples, recorded with stored samples (``genrl/loop/offline.py``)."""
        return {"rollout": type(self).__name__}

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a resume."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


__all__ = ["Chunk", "ChunkStream", "OutputFn", "Rollout", "chunk_rows"]
