"""The token policy gradient on corrupted views of a masked-diffusion model (MaskGRPO, d1).

The same objective trains masked-diffusion LMs and masked image-token generators (aMUSEd):
both are ``UnmaskingPolicy``s whose samples are a prompt and ``L`` completion tokens, and the
views corrupt the completion only, or also the prompt where the policy can mask it (d1's
prompt masking; a CLIP-encoded image prompt has no mask token and stays whole).

A masked-diffusion LM has no exact sequence likelihood, so each sampled completion is scored
under ``num_iterations`` seeded corruptions ("views", from a pluggable estimator of
``genrl/objectives/dllm_estimators.py``): MaskGRPO's rising mask ratio with fading-out masking,
d1's one-step estimator, UniGRPO's random ratio or TraceRL's sampling trace. The old and
reference log-probs of every view are computed before the first update, so the current policy
is compared on exactly the same corrupted inputs, with the GRPO family's clipped surrogate:

    L = agg_{views, counted t} max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))
        + beta * agg KL_k3,     rho_t = p_theta(x_t | view) / p_old(x_t | view).

Every (sample, view) pair is a training unit; ``train.inner_epochs`` passes over all of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from genrl.data.batches import MaskedSamples, MaskedUnits
from genrl.data.rng import RolloutNoise, Streams
from genrl.objectives.token_configs import MaskedViewsConfig
from genrl.objectives.tokens import TokenObjective
from genrl.policies.protocols import UnmaskingPolicy


class MaskedTokenPolicyGradient(TokenObjective[UnmaskingPolicy, MaskedSamples, MaskedUnits]):
    """The token objective over an ``UnmaskingRollout``'s samples, one unit per (sample, view).

    Args:
        config: the objective's fields and the views'.
        train_config: the run's config (``generation``, ``train``'s batching).
    """

    def __init__(self, config: Any, train_config: Any) -> None:
        super().__init__(config, train_config)
        self.views = config
        self.estimator = config.make_estimator()
        g = train_config.generation
        self.num_views = (
            (g.diffusion_steps or g.max_new_tokens)
            if config.estimator == "trace"
            else config.num_iterations
        )

    def num_units(self, num_samples: int) -> int:
        """Views per sample: one per inner iteration, or one per sampling step for ``trace``."""
        return num_samples * self.num_views

    @torch.no_grad()
    def units(
        self, policy: UnmaskingPolicy, batch: MaskedSamples, noise: RolloutNoise
    ) -> MaskedUnits:
        """``N * V`` units, view-major within each sample. View ``j`` draws its seed from the
        iteration's ``MASK_VIEWS + j`` stream (offset by this process's first sample), so the
        old, current and reference policies score the same corruption."""
        trace = self.views.estimator == "trace"
        iterations = 1 if trace else self.views.num_iterations
        # A prompt the policy cannot mask is kept out of the estimator (it sees an empty one)
        # and put back whole in every view.
        maskable = batch.prompt_ids if policy.masks_prompts else batch.prompt_ids[:, :0]
        views = []
        for j in range(iterations):
            generator = noise.generator((Streams.MASK_VIEWS, j))
            seed = int(torch.randint(2**62, (1,), generator=generator)) + noise.local.start
            views += self.estimator.views(
                maskable, batch.tokens, batch.valid, batch.reveal_step,
                policy.mask_token_id, seed, j, self.num_views if trace else iterations,
            )  # fmt: skip
        if not policy.masks_prompts:
            views = [dataclasses.replace(w, prompt=batch.prompt_ids) for w in views]
        n, v = len(batch), len(views)
        inputs = torch.stack([torch.cat([w.prompt, w.completion], 1) for w in views], dim=1)
        counted = torch.stack([w.counted for w in views], dim=1).reshape(n * v, -1)
        rows = torch.arange(n, device=inputs.device).repeat_interleave(v)
        units = MaskedUnits(
            inputs=inputs.reshape(n * v, -1),
            attention_mask=torch.cat([batch.prompt_mask, torch.ones_like(batch.tokens)], 1)[rows],
            targets=batch.tokens[rows],
            counted=counted,
            old_log_probs=counted[:, :0].float(),
            ref_log_probs=counted[:, :0].float(),
            advantages=batch.advantages[rows],
        )
        units.old_log_probs, units.ref_log_probs = self.old_and_reference(policy, units)
        return units

    def log_probs(self, policy: UnmaskingPolicy, units: MaskedUnits) -> torch.Tensor:
        """At temperature 1, as both released codes score (d1, MaskGRPO)."""
        return policy.token_log_probs(units.inputs, units.attention_mask, units.targets)

    def counted(self, units: MaskedUnits) -> torch.Tensor:
        return units.counted

    def extra_metrics(self, units: MaskedUnits) -> dict[str, torch.Tensor]:
        return {"counted_tokens": units.counted.float().sum(1).mean()}


__all__ = ["MaskedTokenPolicyGradient", "MaskedViewsConfig"]
