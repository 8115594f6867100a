"""Typed rollout containers. Every tensor field has a leading batch dimension ``N``.

``Batch.select(index)`` slices every per-sample field at once, so minibatching and per-process
slicing never forget a field. The base and its helpers are ``batch_base.py``, the token
policies' containers ``token_batches.py``; this module holds the flow containers and names
them all, so that ``genrl.data.batches`` is the one place to import a batch type from.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from genrl.data.batch_base import B, Batch, _only, _pad_to, _sequence_widths
from genrl.data.token_batches import MaskedSamples, MaskedUnits, TokenRollout
from samplers.tree import TreeRollout


class FlowBatch(Batch, abc.ABC):
    """Base of the batches of flow rollouts: they end in clean samples (``final``)."""

    @classmethod
    def concatenate(cls: type[B], batches: list[B]) -> B:
        """As ``Batch.concatenate``; prompt encodings (a ``condition`` field) whose sequence
        length (dim 1) varies from batch to batch, as when a pipeline pads prompt embeddings
        to the longest prompt of a batch (QwenImage), are zero-padded to the longest first:
        such adapters carry a mask whose zeros mark padding."""
        if batches and "condition" in {f.name for f in dataclasses.fields(cls)}:
            conditions = [cast(Any, b).condition for b in batches]
            widths = _sequence_widths(conditions)
            if widths:
                batches = [
                    dataclasses.replace(
                        cast(Any, b), condition={**c, **_pad_to(_only(c, widths), widths)}
                    )
                    for b, c in zip(batches, conditions, strict=True)
                ]
        return super().concatenate(batches)

    @property
    @abc.abstractmethod
    def final(self) -> torch.Tensor:
        """``[N, *event]`` clean samples (what the rewards score)."""


@dataclass
class FlowTrajectory(FlowBatch):
    """Trajectories of a flow model sampled with a stochastic sampler.

    Attributes:
        prompts: ``N`` prompt strings.
        group_ids: ``[N]`` long; samples of one prompt's group share an id (unique per iteration
            across all processes).
        condition: the adapter's prompt encoding, a dict of ``[N, ...]`` tensors.
        latents: ``[N, T + 1, *event]`` float32 states ``x_{s_0} .. x_{s_T}``; ``latents[:, -1]`` is
            the final sample.
        log_probs: ``[N, T]`` float32 log-probs of each transition at sampling time.
        trainable_steps: ``[N, T]`` bool, True where the transition was drawn stochastically and
            may be trained (all True for a pure SDE rollout).
        advantages: ``[N]`` float32, or ``[N, T]`` with one advantage per step; filled after
            rewards (zeros until then).
        step_kl: ``[N, T]`` KL of each stochastic step to the reference policy, measured while
            sampling (Flow-GRPO's ``kl_reward``); None when not measured.
        means: ``[N, T, *event]`` each step's transition mean at sampling time (GRPO-Guard's
            ratio normalisation); None when not kept.
        excluded: ``[N]`` bool, samples left out of training although their rewards count
            (MC-GRPO's median pivots, ``Objective.excluded_samples``); None: none.
    """

    prompts: list[str]
    group_ids: torch.Tensor
    condition: dict[str, torch.Tensor]
    latents: torch.Tensor
    log_probs: torch.Tensor
    trainable_steps: torch.Tensor
    advantages: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    step_kl: torch.Tensor | None = None
    means: torch.Tensor | None = None
    excluded: torch.Tensor | None = None

    @property
    def final(self) -> torch.Tensor:
        """``[N, *event]`` clean samples."""
        return self.latents[:, -1]


@dataclass
class TreeTrajectories(FlowBatch):
    """The leaves of this process's trees (per-sample fields) and the trees themselves
    (BranchGRPO's rollout).

    Attributes:
        prompts: ``N = R * L`` prompts, tree-major.
        group_ids: ``[N]``.
        leaves: ``[N, *event]`` final latents.
        condition: the ``R`` trees' prompt encodings (``[R, ...]`` tensors).
        tree: the tree rollout (states, edges, log-probs per step).
        advantages: ``[N, T]``: entry ``(l, t)`` is the advantage of the edge of step ``t`` on
            the path to leaf ``l`` (filled by the trainer).
    """

    prompts: list[str]
    group_ids: torch.Tensor
    leaves: torch.Tensor
    condition: dict[str, torch.Tensor]
    tree: TreeRollout
    advantages: torch.Tensor = field(default_factory=lambda: torch.zeros(0))

    @property
    def final(self) -> torch.Tensor:
        """``[N, *event]`` the leaves (the clean samples)."""
        return self.leaves


class SharedRows:
    """Per-sample tensors that many training units index by row instead of copying.

    A trajectory contributes up to ``T`` transitions; copying its prompt embedding into each
    would cost ``T`` times the memory (3.5 GB per GPU for SD3.5's ``[333, 4096]`` embeddings at
    Flow-GRPO's batch). ``Batch.select`` leaves this object alone and slices the row indices.
    """

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def rows(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: v[index.to(v.device)] for k, v in self.tensors.items()}


@dataclass
class FlowTransitions(Batch):
    """Flat (sample, timestep) pairs: the training unit of step-wise flow policy gradients.

    Attributes:
        rows: ``[U]`` long, the trajectory each transition comes from (its row in
            ``conditions``).
        conditions: the rollout's prompt encodings, ``[N, ...]`` tensors shared by all units.
        sample: ``[U, *event]`` state before the step.
        next_sample: ``[U, *event]`` state after the step (the action being scored).
        timestep_index: ``[U]`` long step index into the sampler's sigmas.
        old_log_probs: ``[U]`` log-prob recorded at rollout time.
        advantages: ``[U]`` advantage of the transition (its trajectory's, or its step's).
        old_means: ``[U, *event]`` transition mean at rollout time (GRPO-Guard); None if unused.
    """

    rows: torch.Tensor
    conditions: SharedRows
    sample: torch.Tensor
    next_sample: torch.Tensor
    timestep_index: torch.Tensor
    old_log_probs: torch.Tensor
    advantages: torch.Tensor
    old_means: torch.Tensor | None = None

    @property
    def condition(self) -> dict[str, torch.Tensor]:
        """``[U, ...]`` prompt encodings of these transitions."""
        return self.conditions.rows(self.rows)


@dataclass
class FlowEndpoints(FlowBatch):
    """Clean samples of a flow model (no trajectory): the rollout of regression objectives
    (RAM, GDRO, DiffusionNFT), sampled with any sampler or read from an offline store.

    Attributes:
        prompts: ``N`` prompt strings.
        group_ids: ``[N]`` long group ids (as in ``FlowTrajectory``).
        condition: the adapter's prompt encoding, a dict of ``[N, ...]`` tensors.
        samples: ``[N, *event]`` float32 clean latents ``x_0``.
        advantages: ``[N]`` float32, filled after rewards.
    """

    prompts: list[str]
    group_ids: torch.Tensor
    condition: dict[str, torch.Tensor]
    samples: torch.Tensor
    advantages: torch.Tensor = field(default_factory=lambda: torch.zeros(0))

    @property
    def final(self) -> torch.Tensor:
        """``[N, *event]`` clean samples (what the rewards score)."""
        return self.samples


@dataclass
class NoisedEndpoints(Batch):
    """Clean samples noised as in pretraining, ``x_t = (1 - t) x_0 + t eps``: the training unit
    of the regression objectives. A unit holds ``M`` members that share ``t`` (``M = 1`` for
    per-sample losses; ``M`` = the group for GDRO, whose members also share ``eps``).

    Attributes:
        rows: ``[U, M]`` long, each member's row in ``conditions`` (its sample in the rollout).
        conditions: the rollout's prompt encodings, shared by all units.
        clean: ``[U, M, *event]`` clean samples ``x_0``.
        noise: ``[U, M, *event]`` Gaussian noise ``eps``.
        sigma: ``[U]`` noise level ``t`` in (0, 1).
        advantages: ``[U, M]`` the members' advantages.
    """

    rows: torch.Tensor
    conditions: SharedRows
    clean: torch.Tensor
    noise: torch.Tensor
    sigma: torch.Tensor
    advantages: torch.Tensor

    @property
    def noised(self) -> torch.Tensor:
        """``[U, M, *event]`` the states ``x_t`` the model sees."""
        t = self.sigma.view(-1, *([1] * (self.clean.dim() - 1)))
        return (1 - t) * self.clean + t * self.noise

    @property
    def condition(self) -> dict[str, torch.Tensor]:
        """``[U * M, ...]`` prompt encodings, member-major within a unit."""
        return self.conditions.rows(self.rows.reshape(-1))


__all__ = [
    "Batch",
    "FlowBatch",
    "FlowEndpoints",
    "FlowTrajectory",
    "FlowTransitions",
    "MaskedSamples",
    "MaskedUnits",
    "NoisedEndpoints",
    "SharedRows",
    "TokenRollout",
    "TreeTrajectories",
]
