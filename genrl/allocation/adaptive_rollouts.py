"""AR3PO's adaptive rollout (Zhang, Yao, Yu, Liu, Yin, Yin, Yun and Li 2025, "Improving Sampling
Efficiency in RLVR through Adaptive Rollout and Response Reuse", arXiv 2509.25808).

The paper's abstract: adaptive rollout "dynamically allocates more responses to difficult
prompts while saving computation on easier ones". As implemented here, in stages: every prompt
of the iteration gets ``stage_samples`` samples; a prompt none of whose samples is correct (its
metric above 0.5) gets ``stage_samples`` more in the next stage, up to ``max_stages`` stages;
each prompt's group is all its samples, so easy prompts train on small groups and hard ones on
large. A prompt still without a correct sample after the last stage keeps its all-wrong group,
whose advantages are zero (AR3PO's response reuse, ``replay.reuse_correct``, fills such groups
on the uniform path). Only the abstract was at hand when this was written: the stage size, the
number of stages and "correct" as a metric above 0.5 are genrl's choices, each an option of
``allocation.adaptive_rollouts``.
"""

from __future__ import annotations

from typing import Any

import torch

from genrl.allocation.base import Allocation, AllocationPolicy, PromptDraw, RoundSampler


class AdaptiveRollouts(AllocationPolicy):
    """Stages of samples until each prompt has a correct one (module docstring)."""

    def allocate(self, iteration: int, draw: PromptDraw, sample: RoundSampler) -> Allocation:
        cfg = self.config
        prompts = draw(self.groups, 0)
        members: list[list[tuple[int, int]]] = [[] for _ in prompts]  # (stage, position)
        rounds: list[Any] = []
        waiting = list(range(len(prompts)))
        for stage in range(cfg.max_stages):
            scored = sample(
                [prompts[i] for i in waiting], [cfg.stage_samples] * len(waiting), stage
            )
            rounds.append(scored)
            metric = self.read_metric(scored)
            still = []
            for index, prompt_index in enumerate(waiting):
                where = scored.group(index)
                members[prompt_index].extend((stage, int(p)) for p in where)
                if not bool((metric[where] > 0.5).any()):
                    still.append(prompt_index)
            waiting = still
            if not waiting:
                break
        # Each prompt's samples from every stage, in stage order, as one group: the stages'
        # batches joined once, then reordered by prompt.
        offsets = [0]
        for scored in rounds:
            offsets.append(offsets[-1] + len(scored.group_ids))
        order = [offsets[stage] + position for group in members for stage, position in group]
        positions = torch.tensor(order)
        joined = type(rounds[0].rollout).concatenate([r.rollout for r in rounds])
        rollout = joined.select(positions)
        merged = {k: torch.cat([r.scores[k] for r in rounds])[positions] for k in rounds[0].scores}
        sizes = [len(group) for group in members]
        prompt_list = [p for p, size in zip(prompts, sizes, strict=True) for _ in range(size)]
        group_ids = torch.arange(len(prompts)).repeat_interleave(torch.tensor(sizes))
        return Allocation(
            rollout=rollout,
            prompts=prompt_list,
            group_ids=group_ids,
            scores=merged,
            sampled_scores=merged,
            sampled_group_ids=group_ids,
            generated=len(group_ids),
            metrics={
                "stages": float(len(rounds)),
                "group_size_mean": sum(sizes) / len(sizes),
                "unsolved_fraction": len(waiting) / len(prompts),
            },
        )


__all__ = ["AdaptiveRollouts"]
