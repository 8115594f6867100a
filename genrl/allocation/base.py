"""The allocation contract: how an iteration spends its rollout budget over prompts.

The default (``allocation.name=uniform``) gives every prompt of the iteration
``train.group_size`` samples, in one round (``BatchCollector.collect_round``). An
``AllocationPolicy`` decides instead which prompts are sampled, how many times each, over how
many rounds, and which of those samples form the training groups; the collector samples and
scores what it asks for (``RoundSampler``) and computes the advantages of the groups it returns
(phase 4, unchanged), so allocation never touches an objective or a rollout.

A training group may hold samples drawn in earlier rounds or iterations (Pilot-Commit's pilot
samples); their rewards are the ones recorded when they were scored. The token objectives
recompute old log-probs under the current policy in phase 5 (``Objective.units``), as verl
recomputes them for every training batch, so such samples count as on-policy there; Flow-GRPO
keeps the sampler's log-probs, so their ratio measures the lag and its clip bounds it.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from genrl.config.errors import ConfigError
from genrl.data import batches
from genrl.data.batches import Batch
from genrl.data.rng import stream_generator
from tasks.prompt import prompt_id


@dataclass
class ScoredRound:
    """What ``RoundSampler`` returns: the samples of one round, scored.

    Attributes:
        prompts: the ``N`` prompts, each repeated for its samples (consecutively).
        group_ids: ``[N]`` long, the index of each sample's prompt in the round's prompt list.
        rollout: the ``N`` samples (the rollout's batch type).
        scores: every reward score, name -> ``[N]`` float.
    """

    prompts: list[Any]
    group_ids: torch.Tensor
    rollout: Batch
    scores: dict[str, torch.Tensor]

    def group(self, index: int) -> torch.Tensor:
        """``[n]`` long: the positions of prompt ``index``'s samples."""
        return (self.group_ids == index).nonzero()[:, 0]


class RoundSampler(Protocol):
    def __call__(self, prompts: list[Any], counts: list[int], round_index: int) -> ScoredRound:
        """Sample ``counts[i]`` completions of ``prompts[i]`` with the current policy and score
        them; ``round_index`` (unique within the iteration) selects the round's random
        streams, so a resumed run samples what an uninterrupted one samples."""
        ...


PromptDraw = Callable[[int, int], list[Any]]
"""``(count, offset) -> prompts``: the iteration's training prompts ``offset .. offset+count``
(``PromptSource.sample``), the same on a resumed run."""


@dataclass
class Allocation:
    """An iteration's training groups and what it sampled to get them.

    Attributes:
        rollout: the training samples, each group's consecutive.
        prompts: their prompts (``len(rollout)``).
        group_ids: ``[N]`` long group ids, ``0 .. groups - 1``.
        scores: the training samples' scores, name -> ``[N]``.
        sampled_scores: the scores of every sample drawn this iteration (what the current
            policy achieves, for the reward metrics), name -> ``[M]``.
        sampled_group_ids: ``[M]`` their group ids (unique per prompt and round).
        generated: samples drawn this iteration (the rollout budget it spent).
        metrics: the policy's own numbers (rounds, buffer size, ...), logged under
            ``allocation/``.
    """

    rollout: Batch
    prompts: list[Any]
    group_ids: torch.Tensor
    scores: dict[str, torch.Tensor]
    sampled_scores: dict[str, torch.Tensor]
    sampled_group_ids: torch.Tensor
    generated: int
    metrics: dict[str, float] = field(default_factory=dict)


class AllocationError(RuntimeError):
    """The policy could not fill the iteration's groups within its round cap."""


class AllocationPolicy(abc.ABC):
    """Decides an iteration's prompts, sample counts and training groups.

    Args:
        config: the policy's config section (``allocation.<name>``).
        groups: training groups per iteration (``train.prompts_per_iteration``).
        group_size: ``train.group_size``, the samples per group a uniform run draws.
        metric: the score the policy reads (a 0/1 accuracy for the RLVR methods).
        seed: the run's seed (the policy's random choices derive from it).
        training_prompts: the prompt source's training prompts.
    """

    def __init__(
        self,
        config: Any,
        groups: int,
        group_size: int,
        metric: str,
        seed: int,
        training_prompts: list[Any],
    ) -> None:
        self.config = config
        self.groups = groups
        self.group_size = group_size
        self.metric = metric
        self.seed = seed
        # Checkpoints hold prompt ids; a resumed run finds the prompts (and their columns) here.
        self.prompts_by_id = {prompt_id(p): p for p in training_prompts}

    def generator(self, iteration: int) -> torch.Generator:
        """The iteration's stream for the policy's random choices (the same on resume)."""
        return stream_generator("genrl", "allocation", self.seed, iteration)

    @abc.abstractmethod
    def allocate(self, iteration: int, draw: PromptDraw, sample: RoundSampler) -> Allocation:
        """Sample (through ``sample``) and return iteration ``iteration``'s training groups."""

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs (tensors and plain values only: checkpoints load with
        ``weights_only``)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state

    def read_metric(self, scored: ScoredRound) -> torch.Tensor:
        if self.metric not in scored.scores:
            raise ConfigError(
                f"allocation.metric={self.metric!r} is not a reward score; scores are: "
                f"{', '.join(scored.scores)}"
            )
        return scored.scores[self.metric].detach().double().cpu()


def batch_to_state(batch: Batch) -> dict[str, Any]:
    """A batch as plain values (its class name and fields), for ``weights_only`` checkpoints:
    its ``prompts`` become prompt ids (a ``Prompt``'s columns may hold pictures)."""
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    if "prompts" in fields:
        fields["prompts"] = [prompt_id(p) for p in fields["prompts"]]
    return {"type": type(batch).__name__, "fields": fields}


def batch_from_state(state: dict[str, Any], prompts_by_id: dict[str, Any]) -> Batch:
    """The batch ``batch_to_state`` wrote (only the batch types of ``genrl.data.batches``)."""
    cls = getattr(batches, state["type"], None)
    if not (isinstance(cls, type) and issubclass(cls, Batch)):
        raise ValueError(f"not a batch type of genrl.data.batches: {state['type']!r}")
    fields = dict(state["fields"])
    if "prompts" in fields:
        fields["prompts"] = [prompts_by_id[i] for i in fields["prompts"]]
    return cls(**fields)


__all__ = [
    "Allocation",
    "AllocationError",
    "AllocationPolicy",
    "PromptDraw",
    "RoundSampler",
    "ScoredRound",
    "batch_from_state",
    "batch_to_state",
]
