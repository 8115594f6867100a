"""Held-out evaluation: fixed prompts and seeds, outputs made by the rollout's deterministic
(or fixed-seed) sampler (``Rollout.evaluation_outputs``), shared out over processes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from genrl.prompts.sources import reward_metadata
from genrl.rollouts.base import OutputFn
from tasks.prompt import prompt_id


@dataclass
class EvalResult:
    """Mean reward over all samples, per prompt, and the samples themselves.

    Attributes:
        reward: mean primary reward over all ``P * S`` samples.
        per_prompt: prompt id (``prompt_id``: its text, with ``#row`` for a dataset row) ->
            mean reward of its ``S`` samples.
        scores: name -> mean of every score the reward returned, over the samples where it is
            not NaN (a score that applies to some samples only, e.g. a per-category accuracy).
        outputs: the ``P * S`` decoded samples (images ``[P * S, C, H, W]`` or texts); sample
            ``i`` belongs to prompt ``i % P``.
        prompts: the ``P * S`` prompts in sample order.
    """

    reward: float
    per_prompt: dict[str, float]
    scores: dict[str, float]
    outputs: Any
    prompts: list[str]


@torch.no_grad()
def evaluate(
    reward: Any,
    prompts: list[str],
    *,
    samples_per_prompt: int,
    outputs_fn: OutputFn,
    batch_size: int = 256,
    accelerator: Any = None,
) -> EvalResult:
    """Score ``samples_per_prompt`` held-out outputs per prompt.

    The layout is fixed so that numbers are comparable across runs and with the manifest of the
    embedded assets: sample ``i`` is conditioned on ``prompts[i % P]``. ``outputs_fn`` makes a
    chunk's outputs (``Rollout.evaluation_outputs``: e.g. a flow policy's ODE samples from
    ``randn(P * S, *event, generator=manual_seed(seed))``).

    With an ``accelerator`` of several processes, chunk ``k`` of ``batch_size`` samples is made
    and scored by process ``k % N`` and the results are exchanged, so every process returns the
    one-process result (each chunk's randomness depends on its sample indices only) in about
    ``1 / N`` of the time (not under FSDP or DeepSpeed, whose forwards need every process).
    """
    n = len(prompts) * samples_per_prompt
    all_prompts = [prompts[i % len(prompts)] for i in range(n)]
    rank, world = _process_layout(accelerator)
    mine = []
    for k, start in enumerate(range(0, n, batch_size)):
        if k % world != rank:
            continue
        chunk = all_prompts[start : start + batch_size]
        decoded = outputs_fn(chunk, slice(start, start + len(chunk)))
        scored = reward(decoded, chunk, reward_metadata(chunk))
        scores_k = {name: v.cpu() for name, v in scored.scores.items()}
        mine.append((k, decoded.cpu() if isinstance(decoded, torch.Tensor) else decoded, scores_k))
    if world > 1:
        from accelerate.utils import gather_object

        mine = gather_object(mine)  # every process's (index, outputs, scores), in rank order
    mine.sort(key=lambda item: item[0])
    chunks = [item[1] for item in mine]
    score_chunks = [item[2] for item in mine]
    scores = {k: torch.cat([c[k] for c in score_chunks]) for k in score_chunks[0]}
    primary = scores[reward.name]
    per_prompt = {
        prompt_id(p): float(primary[i :: len(prompts)].mean()) for i, p in enumerate(prompts)
    }
    if isinstance(chunks[0], torch.Tensor):
        outputs: Any = torch.cat(chunks)
    else:
        outputs = [item for chunk in chunks for item in chunk]
    return EvalResult(
        reward=float(primary.mean()),
        per_prompt=per_prompt,
        scores={k: float(v.nanmean()) for k, v in scores.items()},
        outputs=outputs,
        prompts=all_prompts,
    )


def _process_layout(accelerator: Any) -> tuple[int, int]:
    """(this process's index, processes sharing the chunks). Sharded models (FSDP, DeepSpeed)
    gather parameters from every process in each forward, so there every process runs every
    chunk in step (a process with fewer chunks would wait for the others forever)."""
    if accelerator is None or accelerator.num_processes == 1:
        return 0, 1
    if str(getattr(accelerator, "distributed_type", "")).upper().endswith(("FSDP", "DEEPSPEED")):
        return 0, 1
    from genrl.distributed.sharding import env_requests_fsdp

    if env_requests_fsdp():  # genrl's own FSDP2 on CPU processes (genrl/distributed/sharding.py)
        return 0, 1
    return accelerator.process_index, accelerator.num_processes


@contextlib.contextmanager
def without_ddp_wrapper(policy: Any) -> Iterator[None]:
    """Run the policy's forwards on the module inside its DDP wrapper, restored afterwards.

    Held-out chunks are shared out over DDP processes, so processes make different numbers of
    forwards; DDP's forward broadcasts the module's buffers from process 0 (the first forward
    after a training one does, whatever the grad mode), a collective that then waits forever
    for a process with no chunk left (seen with the tiny SD3 on 2 processes). Evaluation needs
    no gradient synchronisation, so the unwrapped module computes the same outputs. Sharded
    modules (FSDP) keep their wrapper: every process runs every chunk there."""
    module = getattr(policy, "module", None)
    if not isinstance(module, torch.nn.parallel.DistributedDataParallel):
        yield
        return
    policy.module = module.module
    try:
        yield
    finally:
        policy.module = module
