"""The rollout contract: how a process's samples are made (phase 2 of the loop).

A rollout samples with no gradients and records what training needs (flow: every state and
step log-prob; trees: the edges; endpoints: clean samples; tokens: ids and masks). It also
decodes its samples for the rewards, names the extra reward columns, makes the held-out outputs
of evaluation, and keeps any state that must survive a resume (a lagged copy of the policy).
It knows no loss: that is the objective's (``genrl/objectives/base.py``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from genrl.protocols import Policy
from genrl.rng import RolloutNoise
from genrl.rollout import Batch

P = TypeVar("P", bound=Policy)
B = TypeVar("B", bound=Batch)

# (prompts of a chunk, their sample indices in the held-out layout) -> decoded outputs
OutputFn = Callable[[list[str], slice], Any]


class Rollout(abc.ABC, Generic[P, B]):
    """Base of every rollout; built once per run by its algorithm, after the policy. ``P`` is
    the policy protocol it samples from (``genrl/protocols.py``), ``B`` the batch it makes."""

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

    def from_stored(
        self, policy: P, prompts: list[str], group_ids: torch.Tensor, samples: torch.Tensor
    ) -> B:
        """A batch of clean ``samples`` read from an offline store (``train.offline_store``),
        for rollouts whose objective needs nothing else; ``Algorithm.supports_offline`` says
        which do, and the config refuses the others before this is reached."""
        del policy, prompts, group_ids, samples
        raise TypeError(f"{type(self).__name__} cannot train from stored samples")

    def describe(self) -> dict[str, Any]:
        """How this rollout samples, recorded with stored samples (``genrl/offline.py``)."""
        return {"rollout": type(self).__name__}

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a resume."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


__all__ = ["OutputFn", "Rollout"]
