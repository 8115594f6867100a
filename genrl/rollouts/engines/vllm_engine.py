"""``generation.engine=vllm``: completions from a colocated ``vllm.LLM`` on the policy's checkpoint.

A well-kept inference engine (paged key-value cache, continuous batching, fused kernels)
generates far faster than the built-in loop at any real size; what it costs is a second copy of
the weights, which must follow the trainer's (``sync_weights``), and log-probs from other
kernels than training's recomputation (the mismatch that ``algorithm.tis_cap`` corrects, see
``genrl/objectives/tokens.py``).

How it is driven, and why:

- In process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the weight sync hands the trainer's tensors
  to the engine's worker by reference, and the multiprocess engine core does not start on the
  CPU build.
- Prompts go in as token ids (``TokensPrompt``), the policy's own encoding (chat template and
  truncation included), so the engine samples exactly the prompts the trainer scores; the
  tokenizer vLLM loads from the checkpoint only detokenizes for the stop strings.
- Consecutive identical prompts (a group) are one request with ``n`` samples, seeded from the
  run's streams (``vllm_requests.py``, shared with the rollout server's client).
- ``logprobs_mode="processed_logprobs"``: the log-probs of the distribution sampled from, after
  temperature (and top-k/top-p when set), which is training's ``log_softmax(logits / T)`` when
  top-k/top-p are off; vLLM's default (raw) ignores the temperature.
- Weights are pushed through the worker's ``reload_weights`` (vLLM's in-place reload: it maps
  checkpoint names onto its fused layers, e.g. ``q_proj``/``k_proj``/``v_proj`` into
  ``qkv_proj``), all of them at each sync, because a fused layer reloaded in part would be
  left half-initialised; the prefix cache is reset after it (its keys and values came from the
  old weights).
- Chunked prefill is off: vLLM discards the first sample of a prompt prefilled in pieces and
  rewinds its seeded generator, which a CPU generator cannot do (a batch of 256 Countdown
  prompts failed so on the CPU).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import torch

from genrl.config.errors import ConfigError
from genrl.data.rng import RolloutNoise
from genrl.policies.protocols import CausalTokenPolicy, EngineTokenPolicy
from genrl.rollouts.engines.base import TokenEngine
from genrl.rollouts.engines.vllm_requests import (
    EngineRequest,
    batch_requests,
    generation_from,
    refuse_model_inputs,
    served_policy,
)
from samplers.autoregressive import Generation, TokenSampler

# The smallest head size vLLM's CPU attention kernel runs.
CPU_MIN_HEAD_DIM = 32


class VLLMBackend:
    """A ``vllm.LLM`` on a checkpoint and the calls genrl makes on it, as plain values: the
    colocated engine below drives one in the trainer's process, ``genrl serve-rollout`` one in
    its own (``rollout_server.py``)."""

    def __init__(
        self,
        checkpoint: str,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int = 0,
        kv_cache_mb: int = 256,
        eager: bool = True,
        trust_remote_code: bool = False,
    ) -> None:
        # Before vllm is imported: its engine core reads the variable at import.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.checkpoint = checkpoint
        self.llm = LLM(
            model=checkpoint,
            tokenizer=checkpoint,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len or None,
            enforce_eager=eager,
            kv_cache_memory_bytes=kv_cache_mb * 2**20,
            logprobs_mode="processed_logprobs",
            # A prompt prefilled in chunks has its first sample discarded and its seeded
            # generator rewound, which the CPU generator cannot do (RuntimeError: CPU Generator
            # does not use offset): every prompt is prefilled in one step instead.
            enable_chunked_prefill=False,
            trust_remote_code=trust_remote_code,
        )

    def describe(self) -> dict[str, Any]:
        """What a client checks before it samples: the model's vocabulary and length limit."""
        model_config = self.llm.llm_engine.model_config
        return {
            "checkpoint": self.checkpoint,
            "vocab_size": int(model_config.get_vocab_size()),
            "max_model_len": int(model_config.max_model_len),
        }

    def generate(
        self, requests: list[EngineRequest], settings: dict[str, Any]
    ) -> list[list[dict[str, Any]]]:
        """Each request's samples, in order (``vllm_requests.py`` says what a sample holds)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=r.token_ids) for r in requests]
        params = [
            SamplingParams(
                n=r.n,
                temperature=settings["temperature"],
                top_k=settings["top_k"],
                top_p=settings["top_p"],
                max_tokens=settings["max_tokens"],
                stop_token_ids=settings["stop_token_ids"],
                stop=settings["stop"] or None,
                logprobs=0,  # the sampled token's log-prob only
                seed=r.seed,
            )
            for r in requests
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            [
                {
                    "token_ids": list(c.token_ids),
                    "logprobs": [
                        step[token].logprob
                        for step, token in zip(c.logprobs, c.token_ids, strict=True)
                    ],
                    # "stop": an end token or a stop string ended it; "length": cut at the limit.
                    "finish_reason": c.finish_reason,
                }
                for c in sorted(out.outputs, key=lambda c: c.index)
            ]
            for out in outputs
        ]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """vLLM's in-place reload (checkpoint names onto its fused layers), then a reset of the
        prefix cache, whose keys and values came from the old weights."""
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True},
        )
        self.llm.reset_prefix_cache()


class VLLMEngine(TokenEngine):
    """A ``VLLMBackend`` built on the first rollout (the policy is needed: its checkpoint, its
    end tokens, and its current weights, pushed at once so that a resumed or LoRA run starts in
    sync)."""

    def __init__(self, train_config: Any) -> None:
        super().__init__(train_config)
        self.backend: VLLMBackend | None = None

    def _policy(self, policy: CausalTokenPolicy) -> EngineTokenPolicy:
        return served_policy(policy, "vllm")

    def _build(self, policy: EngineTokenPolicy) -> None:
        check_cpu_heads(policy, "generation.engine=vllm")
        config, g = self.train_config, self.train_config.generation
        self.backend = VLLMBackend(
            policy.checkpoint,
            dtype=config.policy.dtype,
            seed=config.seed,
            max_model_len=g.engine_max_model_len,
            kv_cache_mb=g.engine_kv_cache_mb,
            eager=g.engine_eager,
            trust_remote_code=bool(config.policy.kwargs.get("trust_remote_code", False)),
        )
        self.sync_weights(policy)

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
        served = self._policy(policy)
        refuse_model_inputs(model_inputs, "vllm")
        if self.backend is None:
            self._build(served)
        assert self.backend is not None
        requests, settings = batch_requests(
            policy,
            prompt_ids,
            prompt_mask,
            sampler,
            max_new_tokens,
            noise,
            self.train_config.generation.stop_strings,
        )
        samples = [s for group in self.backend.generate(requests, settings) for s in group]
        return generation_from(samples, int(policy.tokenizer.pad_token_id), policy.device)

    def sync_weights(self, policy: CausalTokenPolicy) -> float | None:
        """Push the policy's weights (merged with its LoRA adapter, if any) into the engine."""
        served = self._policy(policy)
        if self.backend is None:
            return None  # built on the first rollout, with the weights of that moment
        start = time.perf_counter()
        with torch.no_grad():
            self.backend.load_weights(served.engine_weights())
        return time.perf_counter() - start


def check_cpu_heads(policy: EngineTokenPolicy, what: str) -> None:
    """Refuse, on the CPU, heads narrower than vLLM's CPU attention kernel runs."""
    model_config = getattr(policy.network, "config", None)
    head_dim = getattr(model_config, "head_dim", None)
    if policy.device.type == "cpu" and head_dim is not None and head_dim < CPU_MIN_HEAD_DIM:
        raise ConfigError(
            f"{what} on the CPU needs attention heads of at least {CPU_MIN_HEAD_DIM} "
            f"dimensions (vLLM's CPU attention kernel); {policy.checkpoint} has {head_dim}: use "
            "a checkpoint with wider heads, an accelerator, or generation.engine=loop"
        )


__all__ = ["VLLMBackend", "VLLMEngine", "check_cpu_heads"]
