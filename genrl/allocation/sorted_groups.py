"""sGPO, sorted Group Policy Optimization (Sudalairaj, Xu, Srivastava and Giannone 2026, "sGPO:
Trading Inference FLOPs for Training Efficiency in RLVR", arXiv 2606.08854).

One profiling pass under the initial policy samples ``profile_samples`` completions of each
training prompt and records its success rate ``p`` (the mean of ``allocation.metric``). That
one pass then drives three things, as the paper's abstract states them:

- **filtering**: prompts the initial policy always solves (``p = 1``) are dropped, and the
  never-solved ones (``p = 0``) are sub-sampled (``unsolvable_keep``);
- **group sizes**: a prompt's group has ``ceil(1 / p)`` samples, within
  ``[min_group_size, max_group_size]`` (``max_group_size`` for ``p = 0``): about one correct
  sample per group, where a group-relative advantage starts to carry signal;
- **curriculum**: prompts are scheduled from easy to hard (``p`` descending).

Each iteration takes the next prompts of the schedule until their groups fill the uniform
run's budget of ``prompts_per_iteration * group_size`` samples (at least one group), so a
comparison with GRPO is at an equal rollout budget per iteration, the profile's samples
counted on top (``allocation/profile_samples``, in iteration 0's ``samples_generated``). At the
end of the schedule it starts again from the easiest prompt.

Only the paper's abstract was read when this was written (its full text and any released code
were not at hand): the profile size, the bounds, the sub-sampling fraction, the budget rule
and the wrap-around are genrl's choices, each an option of ``allocation.sorted_groups``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from genrl.allocation.base import (
    Allocation,
    AllocationError,
    AllocationPolicy,
    PromptDraw,
    RoundSampler,
)
from tasks.prompt import prompt_id

PROFILE_ROUND = 1_000_000
"""Round indices of the profiling pass start here, apart from the training rounds'."""


def group_size_for(success_rate: float, smallest: int, largest: int) -> int:
    """``ceil(1 / p)`` within ``[smallest, largest]``; ``largest`` for ``p = 0``."""
    if success_rate <= 0.0:
        return largest
    return max(smallest, min(largest, math.ceil(1.0 / success_rate - 1e-9)))


def schedule(
    order: list[str], success: dict[str, float], keep_unsolvable: float, curriculum: str
) -> list[str]:
    """The training schedule: ``order`` (the profile's shuffled order) without the solved
    prompts and with the first ``ceil(keep_unsolvable * n)`` of the ``n`` unsolved ones, sorted
    by success rate, highest first, for ``easy_to_hard`` (a stable sort: ties keep ``order``)."""
    unsolved = [i for i in order if success[i] <= 0.0]
    kept_unsolved = set(unsolved[: math.ceil(keep_unsolvable * len(unsolved))])
    kept = [i for i in order if 0.0 < success[i] < 1.0 or i in kept_unsolved]
    if curriculum == "easy_to_hard":
        kept.sort(key=lambda i: -success[i])
    return kept


class SortedGroups(AllocationPolicy):
    """sGPO's profile, filter, group sizes and curriculum (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.success: dict[str, float] = {}  # prompt id -> profiled success rate
        self.order: list[str] = []  # the schedule
        self.position = 0  # the schedule's next prompt

    def profile(self, draw: PromptDraw, sample: RoundSampler) -> int:
        """Profile the training prompts (chunks of the uniform budget); returns the samples."""
        cfg = self.config
        total = cfg.profile_prompts or len(self.prompts_by_id)
        prompts = draw(total, 0)[:total]
        per_round = max(1, self.groups * self.group_size // cfg.profile_samples)
        shuffled: list[str] = []
        generated = 0
        for start in range(0, len(prompts), per_round):
            chunk = prompts[start : start + per_round]
            scored = sample(chunk, [cfg.profile_samples] * len(chunk), PROFILE_ROUND + start)
            generated += len(scored.group_ids)
            metric = self.read_metric(scored)
            for index, prompt in enumerate(chunk):
                key = prompt_id(prompt)
                if key not in self.success:
                    shuffled.append(key)
                self.success[key] = float(metric[scored.group(index)].mean())
        self.order = schedule(shuffled, self.success, cfg.unsolvable_keep, cfg.curriculum)
        if not self.order:
            raise AllocationError(
                "sorted_groups: the initial policy solves every profiled prompt (or none, with "
                "allocation.sorted_groups.unsolvable_keep=0); nothing is left to train on"
            )
        return generated

    def allocate(self, iteration: int, draw: PromptDraw, sample: RoundSampler) -> Allocation:
        cfg = self.config
        profiled = 0
        if not self.order:
            profiled = self.profile(draw, sample)
        budget = self.groups * self.group_size
        chosen: list[Any] = []
        sizes: list[int] = []
        while not chosen or sum(sizes) < budget:
            key = self.order[self.position % len(self.order)]
            size = group_size_for(self.success[key], cfg.min_group_size, cfg.max_group_size)
            if chosen and sum(sizes) + size > budget:
                break
            chosen.append(self.prompts_by_id[key])
            sizes.append(size)
            self.position += 1
            if len(chosen) >= len(self.order):
                break
        scored = sample(chosen, sizes, 0)
        rates = torch.tensor([self.success[prompt_id(p)] for p in chosen])
        return Allocation(
            rollout=scored.rollout,
            prompts=scored.prompts,
            group_ids=scored.group_ids,
            scores=scored.scores,
            sampled_scores=scored.scores,
            sampled_group_ids=scored.group_ids,
            generated=len(scored.group_ids) + profiled,
            metrics={
                "groups": float(len(chosen)),
                "group_size_mean": sum(sizes) / len(sizes),
                "profiled_success_mean": float(rates.mean()),
                "profile_samples": float(profiled),
                "schedule_pass": float((self.position - 1) // len(self.order)),
                "schedule_length": float(len(self.order)),
            },
        )

    def state_dict(self) -> dict[str, Any]:
        return {"success": dict(self.success), "order": list(self.order), "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.success = {k: float(v) for k, v in state.get("success", {}).items()}
        self.order = list(state.get("order", []))
        self.position = int(state.get("position", 0))


__all__ = ["SortedGroups", "group_size_for", "schedule"]
