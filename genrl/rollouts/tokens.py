"""Autoregressive token rollouts (the GRPO family's): completions sampled token by token.

A group's completions are sampled by the run's rollout engine (``generation.engine``,
``genrl/rollouts/engines``: the built-in loop or vLLM) at ``generation.temperature`` (with top-k /
top-p) and cut at ``generation.stop_strings``; the rollout records ids, masks and the engine's
sampling log-probs. The log-probs a loss compares against (old and reference) are the
objective's to compute (``genrl/objectives/tokens.py``), from the same full forward that training
repeats; the engine's are kept beside them to measure, and optionally correct, the mismatch.
"""

from __future__ import annotations

from typing import Any

import torch

from genrl.data.batches import TokenRollout
from genrl.data.rng import RolloutNoise
from genrl.policies.protocols import CausalTokenPolicy
from genrl.rollouts.base import OutputFn, Rollout
from genrl.rollouts.configs import GenerationConfig, TokenGenerationConfig
from genrl.rollouts.engines import build_engine
from samplers.autoregressive import TokenSampler

# Held-out chunks draw from ``Generator(seed * EVAL_SEED_STRIDE + first sample index)``.
EVAL_SEED_STRIDE = 100_003


class AutoregressiveRollout(Rollout[CausalTokenPolicy, TokenRollout]):
    """Sampled completions of a causal LM (or a VLM's language model).

    Args:
        train_config: the run's config (``generation``).

    Attributes:
        sampler: the training sampler; the objective scores tokens with its temperature.
        eval_sampler: held-out completions at ``generation.eval_temperature``.
        engine: what samples the training rollouts (``generation.engine``).
    """

    supports_staleness = True  # ``sampler_log_probs``: the behaviour policy's, for tis_cap

    def __init__(self, train_config: Any) -> None:
        self.train_config = train_config
        g = train_config.generation
        self.sampler = TokenSampler(g.temperature, g.top_k, g.top_p)
        self.eval_sampler = TokenSampler(g.eval_temperature)
        self.engine = build_engine(g.engine, train_config)

    @torch.no_grad()
    def collect(
        self,
        policy: CausalTokenPolicy,
        prompts: list[str],
        group_ids: torch.Tensor,
        noise: RolloutNoise,
    ) -> TokenRollout:
        g = self.train_config.generation
        prompt_ids, prompt_mask = policy.encode_prompts(prompts)
        extras = policy.model_inputs(prompts)
        out = self.engine.generate(
            policy, prompt_ids, prompt_mask, self.sampler, g.max_new_tokens, noise, extras
        )
        mask, finished = out.mask, out.finished
        if g.stop_strings:
            mask = policy.cut_at_stop_strings(out.tokens, mask, g.stop_strings)
            finished = finished | (mask.sum(1) < out.mask.sum(1))  # ended at a stop string
        # Tokens after a stop string stay in the (causal) input but are not trained; they
        # cannot change the log-probs of the tokens before them.
        attention = torch.cat([prompt_mask, out.mask.long()], dim=1)
        not_scored = torch.zeros(len(prompts), 0, device=mask.device)
        return TokenRollout(
            prompts=list(prompts),
            completions=policy.decode(out.tokens, mask),
            group_ids=group_ids,
            input_ids=torch.cat([prompt_ids, out.tokens], dim=1),
            attention_mask=attention,
            completion_mask=mask,
            old_log_probs=not_scored,
            ref_log_probs=not_scored,
            finished=finished,
            advantages=torch.zeros(len(prompts), device=mask.device),
            model_inputs=extras,
            sampler_log_probs=out.log_probs * mask,
        )

    def sync_weights(self, policy: CausalTokenPolicy) -> float | None:
        """The engine's weight sync (``TokenEngine.sync_weights``)."""
        return self.engine.sync_weights(policy)

    def outputs(self, policy: CausalTokenPolicy, batch: TokenRollout) -> list[str]:
        del policy
        return batch.completions

    def reward_metadata(self, batch: TokenRollout) -> list[dict[str, Any]]:
        lengths = batch.completion_lengths.tolist()
        finished = batch.finished.tolist()
        return [
            {"completion_length": int(n), "finished": bool(f)}
            for n, f in zip(lengths, finished, strict=True)
        ]

    def evaluation_outputs(
        self, policy: CausalTokenPolicy, prompts: list[str], samples_per_prompt: int, seed: int
    ) -> OutputFn:
        """Held-out completions at ``generation.eval_temperature`` (greedy by default), with a
        generator seeded from ``eval.seed`` and the chunk's position when sampling."""
        del prompts, samples_per_prompt
        g = self.train_config.generation

        def outputs(chunk: list[str], index: slice) -> list[str]:
            prompt_ids, prompt_mask = policy.encode_prompts(chunk)
            generator = torch.Generator(policy.device)
            generator.manual_seed(seed * EVAL_SEED_STRIDE + index.start)
            out = policy.generate(
                prompt_ids,
                prompt_mask,
                self.eval_sampler,
                g.max_new_tokens,
                generator,
                policy.model_inputs(chunk),
            )
            mask = out.mask
            if g.stop_strings:
                mask = policy.cut_at_stop_strings(out.tokens, mask, g.stop_strings)
            return policy.decode(out.tokens, mask)

        return outputs

    def evaluation_sampling(self) -> str:
        return temperature_words(self.train_config.generation.eval_temperature)


def temperature_words(temperature: float) -> str:
    """ "greedy decoding" or "sampling at temperature T (seeded)": held-out token sampling."""
    if temperature == 0:
        return "greedy decoding (the seed does not enter)"
    return f"sampling at temperature {temperature:g}, seeded by position"


__all__ = ["EVAL_SEED_STRIDE", "AutoregressiveRollout", "GenerationConfig", "TokenGenerationConfig"]
