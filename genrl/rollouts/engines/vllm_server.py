"""``generation.engine=vllm_server``: completions from a vLLM engine in its own process
(``genrl serve-rollout``, ``rollout_server.py``), over HTTP.

It sends the requests the colocated engine builds (``vllm_requests.py``: the same token ids,
seeds and settings, so a server on the same checkpoint and weights draws the same completions)
and pushes the trainer's weights after every update as one safetensors body (the names the
checkpoint uses; LoRA merged in, as for the colocated engine). The trainer needs only httpx:
the engine may run in its own virtualenv, device or machine. The first rollout checks the
server's vocabulary against the policy's and pushes the current weights, so a resumed or LoRA
run starts in sync. A server that cannot be reached, or refuses a request, stops the run with
one line naming the URL and the server's reason.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from genrl.config.errors import ConfigError
from genrl.data.rng import RolloutNoise
from genrl.policies.protocols import CausalTokenPolicy, EngineTokenPolicy
from genrl.rollouts.engines.base import TokenEngine
from genrl.rollouts.engines.vllm_requests import (
    batch_requests,
    generation_from,
    refuse_model_inputs,
    served_policy,
)
from samplers.autoregressive import Generation, TokenSampler


class RolloutServerError(RuntimeError):
    """The rollout server could not be reached or refused a request (one line)."""


class VLLMServerEngine(TokenEngine):
    """A client of ``genrl serve-rollout`` at ``generation.engine_url``.

    Args:
        train_config: the run's config.
        client: an ``httpx.Client`` to use instead of one of its own (tests pass one bound to
            the server's app).
    """

    def __init__(self, train_config: Any, client: Any = None) -> None:
        super().__init__(train_config)
        g = train_config.generation
        self.url = g.engine_url.rstrip("/")
        self.client = client
        self.checked = False
        token = os.environ.get(g.engine_token_env, "")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _client(self) -> Any:
        if self.client is None:
            import httpx

            timeout = httpx.Timeout(self.train_config.generation.engine_timeout_s, connect=10.0)
            self.client = httpx.Client(base_url=self.url, timeout=timeout)
        return self.client

    def _call(
        self, method: str, path: str, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        import httpx

        try:
            reply = self._client().request(
                method, path, headers={**self.headers, **(headers or {})}, **kwargs
            )
        except httpx.HTTPError as err:
            raise RolloutServerError(
                f"generation.engine=vllm_server: no rollout server answers at {self.url} "
                f"({type(err).__name__}: {err}); start one with `genrl serve-rollout "
                "CHECKPOINT` or set generation.engine_url"
            ) from None
        try:
            body = reply.json()
        except ValueError:
            body = {"error": reply.text[:200]}
        if reply.status_code != 200:
            reason = body.get("error", reply.reason_phrase) if isinstance(body, dict) else body
            raise RolloutServerError(
                f"the rollout server at {self.url} answered {reply.status_code} to {path}: {reason}"
            )
        return body

    def _start(self, policy: EngineTokenPolicy) -> None:
        """Check the server serves this policy's vocabulary, then push the current weights."""
        health = self._call("GET", "/health")
        vocab = getattr(getattr(policy.network, "config", None), "vocab_size", None)
        if vocab is not None and int(health.get("vocab_size", -1)) != int(vocab):
            raise ConfigError(
                f"the rollout server at {self.url} serves {health.get('checkpoint')!r} with "
                f"{health.get('vocab_size')} tokens; the policy has {vocab}: serve the policy's "
                f"checkpoint ({policy.checkpoint})"
            )
        self.checked = True
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
        served = served_policy(policy, "vllm_server")
        refuse_model_inputs(model_inputs, "vllm_server")
        if not self.checked:
            self._start(served)
        requests, settings = batch_requests(
            policy,
            prompt_ids,
            prompt_mask,
            sampler,
            max_new_tokens,
            noise,
            self.train_config.generation.stop_strings,
        )
        body = {
            "requests": [{"token_ids": r.token_ids, "n": r.n, "seed": r.seed} for r in requests],
            "settings": settings,
        }
        groups = self._call("POST", "/generate", json=body)["samples"]
        if [len(g) for g in groups] != [r.n for r in requests]:
            raise RolloutServerError(
                f"the rollout server at {self.url} returned {sum(map(len, groups))} samples "
                f"for {sum(r.n for r in requests)} asked"
            )
        samples = [s for group in groups for s in group]
        return generation_from(samples, int(policy.tokenizer.pad_token_id), policy.device)

    def sync_weights(self, policy: CausalTokenPolicy) -> float | None:
        """Push the policy's weights (LoRA merged) to the server as one safetensors body."""
        from safetensors.torch import save

        served = served_policy(policy, "vllm_server")
        if not self.checked:
            return None  # pushed on the first rollout
        start = time.perf_counter()
        with torch.no_grad():
            # Tied weights are listed under each name (the engine reloads layers one by one);
            # safetensors refuses shared storage, so each gets its own contiguous CPU copy.
            tensors = {
                n: t.detach().to("cpu").contiguous().clone() for n, t in served.engine_weights()
            }
        self._call(
            "POST",
            "/weights",
            content=save(tensors),
            headers={"Content-Type": "application/octet-stream"},
        )
        return time.perf_counter() - start


__all__ = ["RolloutServerError", "VLLMServerEngine"]
