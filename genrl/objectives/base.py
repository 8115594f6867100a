"""The objective contract: what is learned from a rollout (phases 4 and 5 of the loop).

An objective turns the gathered rewards into advantages, a rollout into training units (with any
no-gradient scoring the loss compares against, e.g. the old and reference log-probs of tokens),
and a minibatch of units into ``(loss, metrics)``. It reads what its rollout recorded and, where
it re-scores samples, uses its rollout's samplers.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from genrl.data.batches import Batch
from genrl.data.rng import RolloutNoise
from genrl.objectives.losses import Metrics
from genrl.policies.protocols import Policy

P = TypeVar("P", bound=Policy)
B = TypeVar("B", bound=Batch)
U = TypeVar("U", bound=Batch)


@dataclass(frozen=True)
class StepContext:
    """What a loss may need to know about the optimizer step its minibatch belongs to.

    Attributes:
        minibatches: minibatches accumulated into the step on each process.
        tokens_per_minibatch: mean number of loss tokens per minibatch over the step's
            minibatches on all processes (for a token mean over the whole step, DAPO's); None
            when the objective does not count tokens.
    """

    minibatches: int = 1
    tokens_per_minibatch: float | None = None


def updates_once(train_config: Any, units: int) -> bool:
    """Whether an iteration of ``units`` training units (on this process) takes exactly one
    optimizer step with one pass: then every loss sees the parameters that sampled the rollout,
    so its old log-probs are the current ones, detached, and need no forward of their own (as
    TRL skips ``old_per_token_logps``)."""
    t = train_config.train
    minibatches = -(-units // t.minibatch_size)
    return t.inner_epochs == 1 and minibatches <= t.gradient_accumulation_steps


class Objective(abc.ABC, Generic[P, B, U]):
    """Base of every objective: ``P`` is the policy protocol it scores with
    (``genrl/policies/protocols.py``), ``B`` the rollout's batch, ``U`` the training units."""

    @property
    def uses_reference(self) -> bool:
        """Whether ``units`` or ``loss`` enter ``policy.reference()`` (a KL term, a reference
        anchor). Under full fine-tuning the run keeps a frozen copy of the network only when
        the objective or the rollout says True; ``reference()`` without one is an error."""
        return False

    def advantage_inputs(self, batch: B) -> dict[str, torch.Tensor]:
        """Per-sample tensors ``[n, ...]`` of this process's rollout that ``advantages`` needs
        besides the rewards (e.g. per-step KL, a tree's edge log-probs); the trainer gathers them
        over processes and passes them as keyword arguments."""
        del batch
        return {}

    @property
    def reward_names(self) -> tuple[str, ...]:
        """Rewards (named as the run's ``reward`` entries) whose scores ``advantages`` takes one
        by one (MARBLE's per-reward advantages): the trainer passes them as ``reward_scores``,
        ``[N, len(names)]`` in this order, besides the aggregated training reward. Empty by
        default."""
        return ()

    @abc.abstractmethod
    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        """Advantages of the gathered batch (all processes): ``[N]``, or ``[N, T]`` with one per
        sample and step."""

    def advantage_metrics(self, advantages: torch.Tensor) -> dict[str, float]:
        """``advantages/mean`` and ``advantages/abs_mean`` of what ``advantages`` returned
        (``[N]`` or ``[N, T]``, every entry one advantage); an objective whose columns mean
        something else (MARBLE's one per reward) says here which entries they are."""
        return {
            "advantages/mean": float(advantages.mean()),
            "advantages/abs_mean": float(advantages.abs().mean()),
        }

    def excluded_samples(
        self, rewards: torch.Tensor, group_ids: torch.Tensor
    ) -> torch.Tensor | None:
        """``[N]`` bool over the gathered batch: samples whose rewards enter the advantages but
        which are left out of training (MC-GRPO's median pivots); None leaves none out. The
        trainer drops them before ``units``."""
        del rewards, group_ids
        return None

    @abc.abstractmethod
    def units(self, policy: P, batch: B, noise: RolloutNoise) -> U:
        """Training units of a rollout whose advantages are filled. Runs without gradients,
        under the rollout's numerics, before any update of the iteration."""

    def num_units(self, num_samples: int) -> int:
        """How many units ``units`` makes from ``num_samples`` samples (plans the LR schedule)."""
        return num_samples

    @abc.abstractmethod
    def loss(
        self, policy: P, minibatch: U, step: StepContext | None = None
    ) -> tuple[torch.Tensor, Metrics]:
        """The scalar loss of a minibatch of units, with metrics. The trainer divides it by
        ``step.minibatches`` and processes average their gradients."""

    def loss_tokens(self, units: U) -> int | None:
        """How many loss tokens these units hold, when the loss normalises by the tokens of a
        whole optimizer step (DAPO's token mean); None otherwise."""
        del units
        return None

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a resume (e.g. reward statistics)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


__all__ = ["Objective", "StepContext", "updates_once"]
