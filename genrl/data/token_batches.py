"""The token policies' containers: ``TokenRollout`` (causal LMs and VLMs) and the masked-diffusion
LMs' ``MaskedSamples`` and ``MaskedUnits``. Every tensor field has a leading batch dimension
``N``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from genrl.data.batch_base import Batch, _pad_columns, _pad_to


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
