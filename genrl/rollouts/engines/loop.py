"""The default rollout engine: the policy's own sampling loop (``samplers/autoregressive.py``,
through ``CausalTokenPolicy.generate``) with a key-value cache, on the trainer's weights.

Exact and always in sync (it reads the weights the optimizer just stepped); its log-probs differ
from training's full-forward recomputation only by the cached forward's rounding."""

from __future__ import annotations

import torch

from genrl.data.rng import RolloutNoise, Streams
from genrl.policies.protocols import CausalTokenPolicy
from genrl.rollouts.engines.base import TokenEngine
from samplers.autoregressive import Generation, TokenSampler


class LoopEngine(TokenEngine):
    """``generation.engine=loop``: one generator on the policy's device for the process's
    batch (``RolloutNoise.device_generator``), as every token run drew before engines."""

    def generate(
        self,
        policy: CausalTokenPolicy,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        sampler: TokenSampler,
        max_new_tokens: int,
        noise: RolloutNoise,
        model_inputs: dict[str, torch.Tensor],
    ) -> Generation:
        generator = noise.device_generator(Streams.TOKEN_SAMPLING, policy.device)
        return policy.generate(
            prompt_ids, prompt_mask, sampler, max_new_tokens, generator, model_inputs
        )


__all__ = ["LoopEngine"]
