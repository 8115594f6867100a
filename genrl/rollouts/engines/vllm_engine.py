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
  run's ``Streams.TOKEN_SAMPLING`` stream at the group's first sample's index in the global
  batch (vLLM seeds sample ``j`` of the request with ``seed + j``), so the seeds follow a
  sample's place in the global batch, not the process layout, and a resume draws them again.
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
from itertools import groupby
from typing import Any

import torch

from genrl.config.errors import ConfigError
from genrl.data.rng import RolloutNoise, Streams
from genrl.policies.protocols import CausalTokenPolicy, EngineTokenPolicy
from genrl.rollouts.engines.base import TokenEngine
from samplers.autoregressive import Generation, TokenSampler

# The smallest head size vLLM's CPU attention kernel runs.
CPU_MIN_HEAD_DIM = 32


class VLLMEngine(TokenEngine):
    """A ``vllm.LLM`` built on the first rollout (the policy is needed: its checkpoint, its end
    tokens, and its current weights, pushed at once so that a resumed or LoRA run starts in
    sync)."""

    def __init__(self, train_config: Any) -> None:
        super().__init__(train_config)
        self.llm: Any = None

    def _policy(self, policy: CausalTokenPolicy) -> EngineTokenPolicy:
        if not isinstance(policy, EngineTokenPolicy):
            raise ConfigError(
                "generation.engine=vllm serves causal LMs (policy.name=causal_lm, countdown_lm); "
                f"the policy is a {type(policy).__name__}: use generation.engine=loop"
            )
        if policy.sharded:
            raise ConfigError("generation.engine=vllm does not serve an FSDP-sharded policy")
        return policy

    def _build(self, policy: EngineTokenPolicy) -> None:
        model_config = getattr(policy.network, "config", None)
        head_dim = getattr(model_config, "head_dim", None)
        if policy.device.type == "cpu" and head_dim is not None and head_dim < CPU_MIN_HEAD_DIM:
            raise ConfigError(
                f"generation.engine=vllm on the CPU needs attention heads of at least "
                f"{CPU_MIN_HEAD_DIM} dimensions (vLLM's CPU attention kernel); "
                f"{policy.checkpoint} has {head_dim}: use a "
                "checkpoint with wider heads, an accelerator, or generation.engine=loop"
            )
        # Before vllm is imported: its engine core reads the variable at import.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        config, g = self.train_config, self.train_config.generation
        self.llm = LLM(
            model=policy.checkpoint,
            tokenizer=policy.checkpoint,
            dtype=config.policy.dtype,
            seed=config.seed,
            max_model_len=g.engine_max_model_len or None,
            enforce_eager=g.engine_eager,
            kv_cache_memory_bytes=g.engine_kv_cache_mb * 2**20,
            logprobs_mode="processed_logprobs",
            # A prompt prefilled in chunks has its first sample discarded and its seeded
            # generator rewound, which the CPU generator cannot do (RuntimeError: CPU Generator
            # does not use offset): every prompt is prefilled in one step instead.
            enable_chunked_prefill=False,
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
        if model_inputs:
            raise ConfigError(
                "generation.engine=vllm takes text prompts only (VLMs through the engine are "
                "not built yet): use generation.engine=loop"
            )
        if self.llm is None:
            self._build(served)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rows = [
            ids[keep].tolist()
            for ids, keep in zip(prompt_ids.cpu(), prompt_mask.cpu().bool(), strict=True)
        ]
        requests, params, start = [], [], 0
        for _, run in groupby(rows):
            count = len(list(run))
            # 62 bits: vLLM adds the sample's index within the request to the seed.
            seed = noise.key(Streams.TOKEN_SAMPLING, "engine", noise.local.start + start) >> 1
            requests.append(TokensPrompt(prompt_token_ids=rows[start]))
            params.append(
                SamplingParams(
                    n=count,
                    temperature=sampler.temperature,
                    top_k=sampler.top_k,
                    top_p=sampler.top_p,
                    max_tokens=max_new_tokens,
                    stop_token_ids=list(policy.eos_token_ids),
                    stop=list(self.train_config.generation.stop_strings) or None,
                    logprobs=0,  # the sampled token's log-prob only
                    seed=seed,
                )
            )
            start += count
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        samples = [c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]
        return self._generation(samples, int(policy.tokenizer.pad_token_id), policy.device)

    @staticmethod
    def _generation(samples: list[Any], pad_token_id: int, device: torch.device) -> Generation:
        """vLLM's completions as the loop's right-padded ``Generation``."""
        width = max([1, *(len(s.token_ids) for s in samples)])
        tokens = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
        log_probs = torch.zeros(len(samples), width)
        mask = torch.zeros(len(samples), width, dtype=torch.bool)
        for row, sample in enumerate(samples):
            ids = list(sample.token_ids)
            tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            log_probs[row, : len(ids)] = torch.tensor(
                [step[token].logprob for step, token in zip(sample.logprobs, ids, strict=True)]
            )
            mask[row, : len(ids)] = True
        # "stop": an end token or a stop string ended it; "length": cut at max_new_tokens.
        finished = torch.tensor([s.finish_reason == "stop" for s in samples], dtype=torch.bool)
        return Generation(
            tokens=tokens.to(device),
            log_probs=log_probs.to(device),
            mask=mask.to(device),
            finished=finished.to(device),
        )

    def sync_weights(self, policy: CausalTokenPolicy) -> float | None:
        """Push the policy's weights (merged with its LoRA adapter, if any) into the engine."""
        served = self._policy(policy)
        if self.llm is None:
            return None  # built on the first rollout, with the weights of that moment
        start = time.perf_counter()
        with torch.no_grad():
            weights = served.engine_weights()
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True},
        )
        self.llm.reset_prefix_cache()
        return time.perf_counter() - start


__all__ = ["VLLMEngine"]
