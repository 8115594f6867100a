"""What the vLLM engines send and get back, as plain values (no vLLM import), and what they
refuse to serve: the colocated engine (``vllm_engine.py``) and the rollout server's client
(``vllm_server.py``) build the same requests and read the same samples, so both draw the same
completions for a seed.

- A group (consecutive identical prompts) is one request with ``n`` samples, seeded from the
  run's ``Streams.TOKEN_SAMPLING`` stream at the group's first sample's index in the global
  batch (vLLM seeds sample ``j`` of a request with ``seed + j``): the seeds follow a sample's
  place in the global batch, not the process layout, and a resume draws them again.
- A sample is ``{"token_ids": [...], "logprobs": [...], "finish_reason": "stop" | "length"}``:
  the sampled tokens, each one's log-prob under the distribution sampled from, and whether an
  end token or stop string ended it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any

import torch

from genrl.config.errors import ConfigError
from genrl.data.rng import RolloutNoise, Streams
from genrl.policies.protocols import CausalTokenPolicy, EngineTokenPolicy
from samplers.autoregressive import Generation, TokenSampler


@dataclass
class EngineRequest:
    """One prompt's request: its token ids, how many samples, the first sample's seed."""

    token_ids: list[int]
    n: int
    seed: int


def group_requests(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, noise: RolloutNoise
) -> list[EngineRequest]:
    """The requests of this process's ``[B, P]`` left-padded prompts, one per group."""
    rows = [
        ids[keep].tolist()
        for ids, keep in zip(prompt_ids.cpu(), prompt_mask.cpu().bool(), strict=True)
    ]
    requests, start = [], 0
    for _, run in groupby(rows):
        count = len(list(run))
        # 62 bits: vLLM adds the sample's index within the request to the seed.
        seed = noise.key(Streams.TOKEN_SAMPLING, "engine", noise.local.start + start) >> 1
        requests.append(EngineRequest(rows[start], count, seed))
        start += count
    return requests


def sampling_settings(
    sampler: TokenSampler, max_new_tokens: int, stop_token_ids: list[int], stop: list[str]
) -> dict[str, Any]:
    """The sampling settings every request of a batch shares (``vllm.SamplingParams`` fields)."""
    return {
        "temperature": float(sampler.temperature),
        "top_k": int(sampler.top_k),
        "top_p": float(sampler.top_p),
        "max_tokens": int(max_new_tokens),
        "stop_token_ids": [int(t) for t in stop_token_ids],
        "stop": list(stop),
    }


def batch_requests(
    policy: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    sampler: TokenSampler,
    max_new_tokens: int,
    noise: RolloutNoise,
    stop_strings: list[str],
) -> tuple[list[EngineRequest], dict[str, Any]]:
    """A batch's requests (``group_requests``) and the settings they share, with the policy's
    end tokens as stop tokens."""
    requests = group_requests(prompt_ids, prompt_mask, noise)
    settings = sampling_settings(
        sampler, max_new_tokens, list(policy.eos_token_ids), list(stop_strings)
    )
    return requests, settings


def generation_from(
    samples: list[dict[str, Any]], pad_token_id: int, device: torch.device
) -> Generation:
    """Samples (in the batch's order) as the loop's right-padded ``Generation``."""
    width = max([1, *(len(s["token_ids"]) for s in samples)])
    tokens = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
    log_probs = torch.zeros(len(samples), width)
    mask = torch.zeros(len(samples), width, dtype=torch.bool)
    for row, sample in enumerate(samples):
        ids = list(sample["token_ids"])
        tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        log_probs[row, : len(ids)] = torch.tensor(sample["logprobs"], dtype=torch.float32)
        mask[row, : len(ids)] = True
    finished = torch.tensor([s["finish_reason"] == "stop" for s in samples], dtype=torch.bool)
    return Generation(
        tokens=tokens.to(device),
        log_probs=log_probs.to(device),
        mask=mask.to(device),
        finished=finished.to(device),
    )


def served_policy(policy: CausalTokenPolicy, engine: str) -> EngineTokenPolicy:
    """``policy`` as one an inference engine can serve, else a one-line ``ConfigError``."""
    if not isinstance(policy, EngineTokenPolicy):
        raise ConfigError(
            f"generation.engine={engine} serves causal LMs (policy.name=causal_lm, "
            f"countdown_lm); the policy is a {type(policy).__name__}: use generation.engine=loop"
        )
    if policy.sharded:
        raise ConfigError(f"generation.engine={engine} does not serve an FSDP-sharded policy")
    return policy


def refuse_model_inputs(model_inputs: dict[str, torch.Tensor], engine: str) -> None:
    if model_inputs:
        raise ConfigError(
            f"generation.engine={engine} takes text prompts only (VLMs through the engine are "
            "not built yet): use generation.engine=loop"
        )


__all__ = [
    "EngineRequest",
    "batch_requests",
    "generation_from",
    "group_requests",
    "refuse_model_inputs",
    "sampling_settings",
    "served_policy",
]
