"""Pilot-Commit (Kim et al. 2026, "Spend Your Rollouts Where It Counts: Rollout Allocation for
Group-Based RL Post-Training"; released as a verl recipe, ``recipe/pc``, read for this file).

Each round samples two things at once, as the released trainer does:

- **pilot**: ``pilot_prompts_factor * prompts_per_iteration`` fresh prompts, ``pilot_samples``
  each. A prompt whose pilot mean of ``allocation.metric`` lies in
  ``[too_hard_below, too_easy_above]`` enters the buffer with its pilot samples; one whose mean
  reaches ``evict_at`` is never drawn again.
- **commit**: up to the groups still missing, taken out of the buffer (``prompt_choice``),
  ``train.group_size`` fresh samples each. A committed prompt's training group is
  ``kept_pilot_samples`` of its pilot samples (``response_choice``) followed by those fresh
  ones, so its pilot samples may be up to ``max_off_iterations`` iterations old, with their
  recorded rewards (the token objectives recompute their old log-probs under the current
  policy in phase 5, as verl recomputes ``old_log_prob`` for the whole training batch;
  ``genrl/allocation/base.py`` says what Flow-GRPO does).

Rounds repeat until ``prompts_per_iteration`` groups are committed (the first round of a run
commits nothing: the buffer is empty). At the end of the iteration, entries older than
``max_off_iterations`` leave the buffer.

Where genrl differs, by necessity: the prompts come from genrl's per-iteration prompt stream
(``PromptSource.sample``) instead of a dataloader's epochs, so "excluded from the next epoch"
becomes "skipped by every later draw"; ``response_choice=max_variance`` counts a sample as
correct when its metric exceeds 0.5 (the released code assumes a 0/1 metric); the random
choices draw from the run's seeded streams.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from genrl.allocation.base import (
    Allocation,
    AllocationError,
    AllocationPolicy,
    PromptDraw,
    RoundSampler,
    batch_from_state,
    batch_to_state,
)
from genrl.data.batches import Batch
from tasks.prompt import prompt_id


@dataclass
class Pilot:
    """A buffered prompt: its pilot samples, their scores and when they were drawn."""

    prompt: Any
    iteration: int
    rollout: Batch
    scores: dict[str, torch.Tensor]
    metric: torch.Tensor  # [n] float64

    @property
    def std(self) -> float:
        return float(self.metric.std(unbiased=False))


def pass_pilot(mean: float, too_hard_below: float, too_easy_above: float) -> str:
    """``"pass"``, ``"too_hard"`` or ``"too_easy"`` for a pilot mean (``filter_batch``)."""
    if mean < too_hard_below:
        return "too_hard"
    if mean > too_easy_above:
        return "too_easy"
    return "pass"


def max_variance_subset(
    metric: torch.Tensor, size: int, generator: torch.Generator
) -> torch.Tensor:
    """``[size]`` positions: half correct, half wrong where the pilot has enough of each (the
    rest from the other kind), each kind drawn at random; correct means a metric above 0.5."""
    correct = (metric > 0.5).nonzero()[:, 0]
    wrong = (metric <= 0.5).nonzero()[:, 0]
    want_correct = size // 2
    if len(correct) < want_correct:
        want_correct = len(correct)
    elif len(wrong) < size - want_correct:
        want_correct = size - len(wrong)
    pick_correct = correct[torch.randperm(len(correct), generator=generator)[:want_correct]]
    pick_wrong = wrong[torch.randperm(len(wrong), generator=generator)[: size - want_correct]]
    return torch.cat([pick_correct, pick_wrong])


class PilotCommit(AllocationPolicy):
    """Pilot-Commit's two-stage allocation with its buffer (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buffer: dict[str, Pilot] = {}  # prompt id -> entry, oldest first
        self.evicted: set[str] = set()

    # -- choices -----------------------------------------------------------------------------

    def take(self, size: int, generator: torch.Generator) -> list[Pilot]:
        """Remove and return ``size`` buffered prompts (all of them when there are no more)."""
        ids = list(self.buffer)
        if len(ids) > size:
            choice = self.config.prompt_choice
            if choice == "random":
                ids = [ids[i] for i in torch.randperm(len(ids), generator=generator)[:size]]
            elif choice == "max_variance":  # highest std, then the newest
                ids = sorted(
                    ids, key=lambda i: (self.buffer[i].std, self.buffer[i].iteration), reverse=True
                )[:size]
            else:
                newest_first = choice == "most_recent"
                ids = sorted(ids, key=lambda i: self.buffer[i].iteration, reverse=newest_first)
                ids = ids[:size]
        return [self.buffer.pop(i) for i in ids]

    def kept(self, pilot: Pilot, generator: torch.Generator) -> torch.Tensor:
        """Positions of the pilot samples that join the training group."""
        size = self.config.kept_pilot_samples or len(pilot.metric)
        if size >= len(pilot.metric):
            return torch.arange(len(pilot.metric))
        if self.config.response_choice == "first_n":
            return torch.arange(size)
        return max_variance_subset(pilot.metric, size, generator)

    def explore(self, draw: PromptDraw, offset: int) -> tuple[list[Any], int]:
        """The round's pilot prompts, skipping evicted ones; returns them and the next offset."""
        want = self.config.pilot_prompts_factor * self.groups
        found: list[Any] = []
        for _ in range(20):  # bounded: each pass draws ``want`` more prompts
            drawn = draw(want, offset)
            offset += want
            found.extend(p for p in drawn if prompt_id(p) not in self.evicted)
            if len(found) >= want:
                return found[:want], offset
        if not found:
            raise AllocationError(
                "pilot_commit: every training prompt reached allocation.pilot_commit.evict_at "
                "and was evicted; nothing is left to explore (raise evict_at or set it to null)"
            )
        return found, offset

    # -- the iteration -----------------------------------------------------------------------

    def allocate(self, iteration: int, draw: PromptDraw, sample: RoundSampler) -> Allocation:
        cfg = self.config
        generator = self.generator(iteration)
        groups: list[tuple[Any, Batch, dict[str, torch.Tensor]]] = []
        sampled: list[dict[str, torch.Tensor]] = []
        sampled_ids: list[torch.Tensor] = []
        counts = {"pass": 0, "too_hard": 0, "too_easy": 0, "explored": 0}
        lags: list[int] = []
        offset, generated, next_id = 0, 0, 0
        for round_index in range(cfg.max_rounds):
            explored, offset = self.explore(draw, offset)
            committed = self.take(self.groups - len(groups), generator) if self.buffer else []
            prompts = explored + [c.prompt for c in committed]
            sizes = [cfg.pilot_samples] * len(explored) + [self.group_size] * len(committed)
            scored = sample(prompts, sizes, round_index)
            generated += len(scored.group_ids)
            sampled.append(scored.scores)
            sampled_ids.append(scored.group_ids + next_id)
            next_id += len(prompts)
            metric = self.read_metric(scored)
            # Pilot stage: buffer the informative prompts, evict the solved ones.
            for index, prompt in enumerate(explored):
                where = scored.group(index)
                values = metric[where]
                mean = float(values.mean())
                verdict = pass_pilot(mean, cfg.too_hard_below, cfg.too_easy_above)
                counts[verdict] += 1
                counts["explored"] += 1
                key = prompt_id(prompt)
                if verdict == "pass":
                    self.buffer.pop(key, None)  # a prompt drawn again: its newest pilot
                    self.buffer[key] = Pilot(
                        prompt,
                        iteration,
                        scored.rollout.select(where),
                        {k: v[where] for k, v in scored.scores.items()},
                        values,
                    )
                if cfg.evict_at is not None and mean >= cfg.evict_at:
                    self.evicted.add(key)
            # Commit stage: kept pilot samples, then the fresh ones, as one group.
            for index, pilot in enumerate(committed, start=len(explored)):
                where = scored.group(index)
                keep = self.kept(pilot, generator)
                rollout = type(pilot.rollout).concatenate(
                    [pilot.rollout.select(keep), scored.rollout.select(where)]
                )
                scores = {
                    k: torch.cat([pilot.scores[k][keep].to(v.device), v[where]])
                    for k, v in scored.scores.items()
                }
                groups.append((pilot.prompt, rollout, scores))
                lags.append(iteration - pilot.iteration)
            if len(groups) >= self.groups:
                break
        else:
            raise AllocationError(
                f"pilot_commit: after {cfg.max_rounds} rounds only {len(groups)} of "
                f"{self.groups} groups were committed ({counts['too_easy']} explored prompts "
                f"too easy, {counts['too_hard']} too hard); raise "
                "allocation.pilot_commit.max_rounds or widen too_hard_below / too_easy_above"
            )
        evicted = self.flush(iteration)
        return self.assemble(
            groups,
            sampled,
            sampled_ids,
            generated,
            {
                "rounds": float(round_index + 1),
                "pass_rate": counts["pass"] / max(counts["explored"], 1),
                "too_easy_rate": counts["too_easy"] / max(counts["explored"], 1),
                "too_hard_rate": counts["too_hard"] / max(counts["explored"], 1),
                "buffer_size": float(len(self.buffer)),
                "buffer_expired": float(evicted),
                "evicted_prompts": float(len(self.evicted)),
                "pilot_lag_mean": sum(lags) / len(lags),
            },
        )

    def flush(self, iteration: int) -> int:
        """Drop entries older than ``max_off_iterations``; returns how many."""
        old = [
            k
            for k, v in self.buffer.items()
            if iteration - v.iteration > self.config.max_off_iterations
        ]
        for key in old:
            del self.buffer[key]
        return len(old)

    def assemble(
        self,
        groups: list[tuple[Any, Batch, dict[str, torch.Tensor]]],
        sampled: list[dict[str, torch.Tensor]],
        sampled_ids: list[torch.Tensor],
        generated: int,
        metrics: dict[str, float],
    ) -> Allocation:
        groups = groups[: self.groups]
        rollouts = [rollout for _, rollout, _ in groups]
        sizes = torch.tensor([len(r) for r in rollouts])
        return Allocation(
            rollout=type(rollouts[0]).concatenate(rollouts),
            prompts=[p for (p, r, _) in groups for _ in range(len(r))],
            group_ids=torch.arange(len(groups)).repeat_interleave(sizes),
            scores={k: torch.cat([s[k] for _, _, s in groups]) for k in groups[0][2]},
            sampled_scores={k: torch.cat([s[k] for s in sampled]) for k in sampled[0]},
            sampled_group_ids=torch.cat(sampled_ids),
            generated=generated,
            metrics=metrics,
        )

    # -- checkpoints -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "buffer": [
                {
                    "prompt": key,
                    "iteration": p.iteration,
                    "rollout": batch_to_state(p.rollout),
                    "scores": p.scores,
                    "metric": p.metric,
                }
                for key, p in self.buffer.items()
            ],
            "evicted": sorted(self.evicted),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer = {
            entry["prompt"]: Pilot(
                self.prompts_by_id[entry["prompt"]],
                int(entry["iteration"]),
                batch_from_state(entry["rollout"], self.prompts_by_id),
                dict(entry["scores"]),
                entry["metric"],
            )
            for entry in state.get("buffer", [])
        }
        self.evicted = set(state.get("evicted", []))


__all__ = ["Pilot", "PilotCommit", "max_variance_subset", "pass_pilot"]
