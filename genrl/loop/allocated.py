"""Phases 1-4 under an allocation policy (``allocation.name`` other than ``uniform``).

The policy (``genrl/allocation/``) decides which prompts are sampled, how many times, over how
many rounds, and which samples form the training groups; this module samples and scores each
round it asks for with the collector's own phases 2-3 (``Rollout.collect`` under the sampling
context, ``BatchCollector.reward_scores``), then runs phase 4 on the groups it returns. Every
round's random streams derive from ``(seed, iteration, round)``, so a resumed run samples what
an uninterrupted one does (the policy's own state, a buffer, goes into checkpoints).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from genrl.allocation.base import ScoredRound
from genrl.data.rng import RolloutNoise
from genrl.loop.rounds import CollectedBatch, SampledRound, sampling_context


def collect_allocated(collector: Any, iteration: int) -> CollectedBatch:
    """The iteration's training batch as ``collector.allocation`` allocates it (``collector``
    is the run's ``BatchCollector``, which calls this; typed ``Any`` since that module imports
    this one)."""
    cfg = collector.config
    assert collector.allocation is not None
    timings = {"rollout_s": 0.0, "reward_s": 0.0}
    reward_updates: dict[str, float] = {}

    def sample(prompts: list[Any], counts: list[int], round_index: int) -> ScoredRound:
        t_start = time.perf_counter()
        expanded = [p for p, c in zip(prompts, counts, strict=True) for _ in range(c)]
        group_ids = torch.arange(len(prompts)).repeat_interleave(torch.tensor(counts))
        n = len(expanded)
        noise = RolloutNoise(
            cfg.seed, iteration, n, slice(0, n), cfg.train.noise_layout, round_index
        )
        drawn = SampledRound(round_index, expanded, group_ids, noise)
        collector.policy.module.eval()
        with sampling_context(collector.accelerator):
            drawn.rollout = collector.rollout.collect(collector.policy, expanded, group_ids, noise)
        t_sampled = time.perf_counter()
        scores, updates = collector.reward_scores(drawn, slice(0, n))
        reward_updates.update(updates)
        timings["rollout_s"] += t_sampled - t_start
        timings["reward_s"] += time.perf_counter() - t_sampled
        return ScoredRound(expanded, group_ids, drawn.rollout, scores)

    def draw(count: int, offset: int) -> list[Any]:
        return collector.prompts.sample(count, cfg.seed, iteration, offset=offset)

    allocated = collector.allocation.allocate(iteration, draw, sample)
    rollout = allocated.rollout
    rollout.group_ids = allocated.group_ids.to(rollout.group_ids.device)
    # 4. Advantages of the training groups (one process: the batch is the gathered batch).
    inputs = collector.objective.advantage_inputs(rollout)
    n = len(rollout)
    advantages = collector.advantages(
        rollout, allocated.scores, allocated.prompts, allocated.group_ids, inputs, slice(0, n)
    )
    extra = {f"allocation/{k}": v for k, v in allocated.metrics.items()}
    extra["allocation/samples_generated"] = float(allocated.generated)
    extra["allocation/samples_trained"] = float(n)
    extra.update({f"reward_update/{k}": v for k, v in reward_updates.items()})
    return CollectedBatch(
        rollout=rollout,
        noise=RolloutNoise(cfg.seed, iteration, n, slice(0, n), cfg.train.noise_layout),
        scores=allocated.sampled_scores,
        group_ids=allocated.sampled_group_ids,
        advantages=advantages,
        timings=timings,
        extra_metrics=extra,
    )


__all__ = ["collect_allocated"]
