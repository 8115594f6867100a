"""Typed rollout containers. Every tensor field has a leading batch dimension ``N``.

``Batch.select(index)`` slices every per-sample field at once, so minibatching and per-process
slicing never forget a field.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch

from samplers.tree import TreeRollout

B = TypeVar("B", bound="Batch")


@dataclass
class Batch:
    """Base class: fields that are tensors, lists or dicts of tensors are per-sample."""

    def __len__(self) -> int:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                return value.shape[0]
            if isinstance(value, list):
                return len(value)
        raise TypeError(f"{type(self).__name__} has no per-sample field")

    def select(self: B, index: torch.Tensor | slice) -> B:
        """A new batch holding the samples at ``index`` (a slice or a ``[M]`` long tensor)."""
        values = {f.name: _select(getattr(self, f.name), index) for f in dataclasses.fields(self)}
        return type(self)(**values)

    def without_excluded(self: B) -> B:
        """The batch without the samples its ``excluded`` field marks (itself when it has no
        such field, or none is marked)."""
        excluded = getattr(self, "excluded", None)
        if excluded is None or not bool(excluded.any()):
            return self
        return self.select((~excluded).nonzero()[:, 0])

    @classmethod
    def concatenate(cls: type[B], batches: list[B]) -> B:
        """One batch with the samples of ``batches`` in order (e.g. the rounds of dynamic
        sampling). Per-sample tensors must agree beyond the batch dimension; subclasses whose
        widths vary from batch to batch (padded token sequences) align them first."""
        if not batches:
            raise ValueError("nothing to concatenate")
        return cls(
            **{
                f.name: _concatenate([getattr(b, f.name) for b in batches], f.name)
                for f in dataclasses.fields(cls)
            }
        )


def _select(value: object, index: torch.Tensor | slice) -> object:
    if isinstance(value, torch.Tensor):
        return value[index]
    if isinstance(value, list):
        if isinstance(index, slice):
            return value[index]
        return [value[i] for i in index.tolist()]
    if isinstance(value, dict):
        return {k: _select(v, index) for k, v in value.items()}
    return value


def _concatenate(values: list, name: str) -> object:
    first = values[0]
    if isinstance(first, torch.Tensor):
        shapes = {tuple(v.shape[1:]) for v in values}
        if len(shapes) > 1:
            raise ValueError(f"cannot concatenate field {name!r}: per-sample shapes {shapes}")
        return torch.cat(values)
    if isinstance(first, list):
        return [item for value in values for item in value]
    if isinstance(first, dict):
        return {k: _concatenate([v[k] for v in values], f"{name}.{k}") for k in first}
    if any(v is not first for v in values[1:]):
        raise ValueError(f"cannot concatenate field {name!r}: batches hold different objects")
    return first


def _pad_to(
    inputs: dict[str, torch.Tensor], sizes: dict[str, list[int]]
) -> dict[str, torch.Tensor]:
    """Each ``[N, ...]`` tensor zero-padded at the end of every non-batch dimension to
    ``sizes[name]``."""
    padded = {}
    for name, tensor in inputs.items():
        for dim, size in enumerate(sizes[name], start=1):
            tensor = _pad_columns(tensor, dim, 0, size - tensor.shape[dim])
        padded[name] = tensor
    return padded


def _sequence_widths(conditions: list[dict[str, torch.Tensor]]) -> dict[str, list[int]]:
    """``{key: [widest dim 1, *rest]}`` for condition tensors that differ only in dim 1."""
    widths = {}
    for key, first in conditions[0].items():
        shapes = {tuple(c[key].shape[1:]) for c in conditions}
        if first.ndim >= 2 and len(shapes) > 1 and len({s[1:] for s in shapes}) == 1:
            widths[key] = [max(s[0] for s in shapes), *first.shape[2:]]
    return widths


def _only(
    condition: dict[str, torch.Tensor], keys: dict[str, list[int]]
) -> dict[str, torch.Tensor]:
    return {k: v for k, v in condition.items() if k in keys}


def _pad_columns(
    tensor: torch.Tensor, dim: int, before: int, after: int, value: float = 0
) -> torch.Tensor:
    """``tensor`` widened along ``dim`` by ``before`` leading and ``after`` trailing columns."""
    if before == 0 and after == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] += before + after
    out = tensor.new_full(shape, value)
    out.narrow(dim, before, tensor.shape[dim]).copy_(tensor)
    return out


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


@dataclass
class TokenRollout(Batch):
    """Sampled completions of a token policy; also its training unit (one row per sequence).

    Attributes:
        prompts: ``N`` prompt strings.
        completions: ``N`` decoded completions (special tokens dropped).
        group_ids: ``[N]`` long group ids (unique per iteration across processes).
        input_ids: ``[N, P + T]`` prompt (left-padded to ``P``) then completion (right-padded).
        attention_mask: ``[N, P + T]`` 1 on real tokens.
        completion_mask: ``[N, T]`` bool, the completion tokens that are trained (up to and
            including the end token; truncated by stop strings).
        old_log_probs: ``[N, T]`` float32 log-probs of the completion tokens under the policy
            that sampled them, recomputed by a full forward (0 outside the mask); ``[N, 0]``
            when the iteration is one optimizer step (training's forward is on-policy).
        ref_log_probs: ``[N, T]`` under the reference policy, or ``[N, 0]`` when no KL is used.
        finished: ``[N]`` bool, the completion ended with an end token (not cut at the limit).
        advantages: ``[N]`` float32, filled after rewards; ``[N, T]`` per token in MSSR's
            units (``advantage=mssr``, entropy-shaped).
        excluded: ``[N]`` bool, samples left out of training although their rewards count
            (MC-GRPO's median pivots, ``Objective.excluded_samples``); None: none.
        model_inputs: the prompts' inputs besides token ids (a VLM's pixels), name ->
            ``[N, ...]`` (``TokenPolicy.model_inputs``); empty for text.
        sampler_log_probs: ``[N, T]`` float32 log-probs of the completion tokens as the rollout
            engine sampled them (0 outside the mask), beside training's recomputation for the
            mismatch metrics and truncated importance sampling; None where not recorded. A
            replayed sample's are those of the earlier policy that sampled it.
        replayed: ``[N]`` bool, True for samples the replay store put into the batch (sampled
            in an earlier iteration, ``genrl/loop/replay.py``); None: every sample is fresh.
    """

    prompts: list[str]
    completions: list[str]
    group_ids: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    old_log_probs: torch.Tensor
    ref_log_probs: torch.Tensor
    finished: torch.Tensor
    advantages: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    excluded: torch.Tensor | None = None
    model_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    sampler_log_probs: torch.Tensor | None = None
    replayed: torch.Tensor | None = None

    @property
    def completion_start(self) -> int:
        """Column ``P`` where every completion starts."""
        return self.input_ids.shape[1] - self.completion_mask.shape[1]

    @property
    def completion_lengths(self) -> torch.Tensor:
        """``[N]`` number of trained completion tokens."""
        return self.completion_mask.sum(dim=1)

    @classmethod
    def concatenate(cls, batches: list[TokenRollout]) -> TokenRollout:
        """Concatenate after widening every batch to the longest prompt (padded on the left)
        and the longest completion (on the right); new columns are masked out (attention 0,
        completion mask False), so their token id (0) is never read."""
        prompt = max(b.completion_start for b in batches)
        length = max(b.completion_mask.shape[1] for b in batches)
        # Packed pixel inputs are zero-padded per sample: widen them to the widest batch's; a
        # batch without images (a round of text-only prompts) gets all-padding rows.
        shapes: dict[str, tuple[torch.Tensor, list[int]]] = {}
        for b in batches:
            for k, v in b.model_inputs.items():
                _, dims = shapes.get(k, (v, [0] * (v.ndim - 1)))
                shapes[k] = (v, [max(d, n) for d, n in zip(dims, v.shape[1:], strict=True)])
        widest = {k: dims for k, (_, dims) in shapes.items()}
        batches = [
            dataclasses.replace(
                b,
                model_inputs={
                    k: b.model_inputs.get(k, v.new_zeros(len(b), *[0] * (v.ndim - 1)))
                    for k, (v, _) in shapes.items()
                },
            )
            for b in batches
        ]
        aligned = []
        for b in batches:
            before, after = prompt - b.completion_start, length - b.completion_mask.shape[1]
            has_ref = b.ref_log_probs.shape[1] > 0
            has_old = b.old_log_probs.shape[1] > 0
            aligned.append(
                dataclasses.replace(
                    b,
                    input_ids=_pad_columns(b.input_ids, 1, before, after),
                    attention_mask=_pad_columns(b.attention_mask, 1, before, after),
                    completion_mask=_pad_columns(b.completion_mask, 1, 0, after),
                    old_log_probs=_pad_columns(b.old_log_probs, 1, 0, after if has_old else 0),
                    ref_log_probs=_pad_columns(b.ref_log_probs, 1, 0, after if has_ref else 0),
                    model_inputs=_pad_to(b.model_inputs, widest),
                    sampler_log_probs=None
                    if b.sampler_log_probs is None
                    else _pad_columns(b.sampler_log_probs, 1, 0, after),
                )
            )
        return super().concatenate(aligned)


@dataclass
class MaskedUnits(Batch):
    """Training units of a masked-diffusion LM: one corrupted view of one sample each.

    Attributes:
        inputs: ``[U, P + L]`` prompt and completion as the model sees them (masks included).
        attention_mask: ``[U, P + L]``.
        targets: ``[U, L]`` the sampled completion tokens being scored.
        counted: ``[U, L]`` bool, the positions that enter the loss.
        old_log_probs: ``[U, L]`` under the sampling policy on the same view, or ``[U, 0]`` when
            the iteration is one optimizer step (training's forward is on-policy).
        ref_log_probs: ``[U, L]`` under the reference, or ``[U, 0]`` without KL.
        advantages: ``[U]``.
    """

    inputs: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    counted: torch.Tensor
    old_log_probs: torch.Tensor
    ref_log_probs: torch.Tensor
    advantages: torch.Tensor


@dataclass
class MaskedSamples(Batch):
    """Completions of a masked-diffusion LM, as sampled (the objective chooses the views).

    Attributes:
        prompts, completions: ``N`` strings (completions cut after the end token).
        group_ids: ``[N]``.
        prompt_ids: ``[N, P]`` prompts left-padded to ``P`` tokens.
        prompt_mask: ``[N, P]`` 1 on real prompt tokens.
        tokens: ``[N, L]`` sampled completion ids.
        valid: ``[N, L]`` bool, positions up to and including the first end token.
        reveal_step: ``[N, L]`` long, the sampling step that revealed each token.
        advantages: ``[N]``.
        excluded: ``[N]`` bool, samples left out of training although their rewards count
            (MC-GRPO's median pivots, ``Objective.excluded_samples``); None: none.
    """

    prompts: list[str]
    completions: list[str]
    group_ids: torch.Tensor
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    tokens: torch.Tensor
    valid: torch.Tensor
    reveal_step: torch.Tensor
    advantages: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    excluded: torch.Tensor | None = None

    @classmethod
    def concatenate(cls, batches: list[MaskedSamples]) -> MaskedSamples:
        """Concatenate after left-padding every batch's prompts to the longest (mask 0)."""
        prompt = max(b.prompt_ids.shape[1] for b in batches)
        aligned = [
            dataclasses.replace(
                b,
                prompt_ids=_pad_columns(b.prompt_ids, 1, prompt - b.prompt_ids.shape[1], 0),
                prompt_mask=_pad_columns(b.prompt_mask, 1, prompt - b.prompt_ids.shape[1], 0),
            )
            for b in batches
        ]
        return super().concatenate(aligned)
