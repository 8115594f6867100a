"""The rollout-engine contract of the token policies: what samples a batch of completions.

A token rollout (``genrl/rollouts/tokens.py``) asks its engine for completions of left-padded
prompts and gets back a ``Generation`` (ids, the sampling log-probs of each token, masks). The
engine owns how they are drawn: the built-in loop over the policy's own forward
(``genrl/rollouts/engines/loop.py``), or an inference engine holding its own copy of the weights
(``genrl/rollouts/engines/vllm_engine.py``), which must then be told when the trainer changed
them (``sync_weights``). Held-out evaluation does not go through the engine: it samples with the
policy's own loop, so that evaluations of runs on different engines stay comparable.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from genrl.data.rng import RolloutNoise
from genrl.policies.protocols import CausalTokenPolicy
from samplers.autoregressive import Generation, TokenSampler


class TokenEngine(abc.ABC):
    """Base of the rollout engines; built once per run by the token rollout, from the run's
    config (``generation.*``), before any policy is at hand.

    Args:
        train_config: the run's config.
    """

    def __init__(self, train_config: Any) -> None:
        self.train_config = train_config

    @abc.abstractmethod
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
        """Completions of this process's ``[B, P]`` left-padded prompts on ``policy.device``:
        at most ``max_new_tokens`` tokens each, drawn by ``sampler``'s settings from
        ``noise``'s ``Streams.TOKEN_SAMPLING``; ``log_probs`` are the engine's own sampling
        log-probs (0 after a row ended)."""

    def sync_weights(self, policy: CausalTokenPolicy) -> float | None:
        """Make the engine sample from ``policy``'s current weights; returns the seconds it
        took, or None for an engine that reads the policy itself (nothing to copy)."""
        del policy
        return None


__all__ = ["TokenEngine"]
