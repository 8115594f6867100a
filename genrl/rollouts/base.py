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
from typing import Any

import torch

from genrl.rng import RolloutNoise
from genrl.rollout import Batch

# (prompts of a chunk, their sample indices in the held-out layout) -> decoded outputs
OutputFn = Callable[[list[str], slice], Any]


class Rollout(abc.ABC):
    """Base of every rollout; built once per run by its algorithm, after the policy."""

    @abc.abstractmethod
    def collect(
        self, policy: Any, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> Batch:
        """This process's samples of ``prompts`` (their ``group_ids``), with no gradients."""

    @abc.abstractmethod
    def outputs(self, policy: Any, batch: Batch) -> Any:
        """Decoded outputs for the reward models (images ``[N, C, H, W]`` or texts)."""

    def reward_metadata(self, batch: Batch) -> list[dict[str, Any]] | None:
        """Per-sample extras for the reward models (TRL's ``**columns``); None when none."""
        del batch
        return None

    @abc.abstractmethod
    def evaluation_outputs(
        self, policy: Any, prompts: list[str], samples_per_prompt: int, seed: int
    ) -> OutputFn:
        """How held-out outputs are made: deterministic (or fixed-seed) samples of chunks of the
        held-out layout, where sample ``i`` belongs to ``prompts[i % len(prompts)]``."""

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a resume."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


__all__ = ["OutputFn", "Rollout"]
