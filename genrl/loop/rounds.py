"""The records phases 1-4 pass along: a sampled round and an iteration's collected batch."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from genrl.data.rng import RolloutNoise


@dataclass
class CollectedBatch:
    """Output of phases 1-4 for one iteration.

    Attributes:
        rollout: this process's rollout, advantages filled.
        noise: the iteration's random streams (also used for shuffling).
        scores: every reward score of the gathered batch, name -> ``[N]``.
        group_ids: ``[N]`` group ids of the gathered batch.
        advantages: ``[N]`` advantages of the gathered batch.
        timings: seconds spent per phase.
        extra_metrics: further iteration metrics (dynamic sampling's rounds, reward updates).

    With dynamic sampling, ``scores`` and ``group_ids`` cover every sample of every round and
    ``advantages`` the training batch.
    """

    rollout: Any
    noise: RolloutNoise
    scores: dict[str, torch.Tensor]
    group_ids: torch.Tensor
    advantages: torch.Tensor
    timings: dict[str, float]
    extra_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class SampledRound:
    """Phases 1-2 of a round (and 3's local scores with ``train.overlap_rewards``).

    Attributes:
        round_index: 0, or a dynamic-sampling refill round.
        prompts: the global prompt list, each repeated ``group_size`` times.
        group_ids: ``[N]`` global group ids (numbered within the round).
        noise: the round's random streams.
        rollout: this process's samples (None until sampled).
        rollout_s: seconds from drawing the prompts to the end of sampling.
        scored: ``(outputs, metadata, local scores)`` when the rewards overlapped sampling.
        reward_wait_s: then, the seconds from the end of sampling to the last scores.
    """

    round_index: int
    prompts: list[str]
    group_ids: torch.Tensor
    noise: RolloutNoise
    rollout: Any = None
    rollout_s: float = 0.0
    scored: tuple[Any, Any, dict[str, torch.Tensor]] | None = None
    reward_wait_s: float = 0.0

    def local_prompts(self, local: slice) -> list[str]:
        return self.prompts[local]


def sampling_context(accelerator: Any) -> contextlib.ExitStack:
    """What sampling runs under: no gradients, the accelerator's autocast."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.no_grad())
    stack.enter_context(accelerator.autocast())
    return stack


__all__ = ["CollectedBatch", "SampledRound", "sampling_context"]
