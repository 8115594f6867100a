"""BranchGRPO's objective (Li et al. 2025): depth-wise advantages of a tree's edges, pruning,
and the flow-step loss of every trained edge (``genrl/objectives/flow_steps.py``).

Leaf rewards are fused up each tree and z-scored depth by depth (``genrl/objectives/tree_advantages.py``,
following the reference code's conventions). The advantages travel as ``[N, T]`` per leaf and
step: entry ``(l, t)`` is the advantage of the edge of step ``t`` on the path to leaf ``l``.
Pruning changes what is trained, never the rollout (``genrl/objectives/tree_pruning.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from genrl.data.batches import FlowTransitions, SharedRows, TreeTrajectories
from genrl.data.rng import RolloutNoise
from genrl.objectives.advantages import clip_advantages
from genrl.objectives.base import Objective, StepContext
from genrl.objectives.flow_configs import TreePolicyGradientConfig
from genrl.objectives.flow_steps import FlowStepLoss
from genrl.objectives.losses import Metrics
from genrl.objectives.tree_advantages import (
    depthwise_advantages,
    edge_advantages_per_leaf,
    from_leaves,
    node_values,
    per_leaf,
)
from genrl.objectives.tree_pruning import (
    kept_edges,
    num_kept_edges,
)
from genrl.policies.protocols import FlowPolicy


class TreePolicyGradient(Objective[FlowPolicy, TreeTrajectories, FlowTransitions]):
    """BranchGRPO's objective over a ``BranchingRollout``'s trees.

    Args:
        config: the objective's fields.
        rollout: the rollout (its schedule; ``rescore``).
        group_size: leaves per tree.
        iterations: the run's iterations (for ``pruning_fraction``).
    """

    def __init__(
        self, config: TreePolicyGradientConfig, rollout: Any, group_size: int, iterations: int
    ) -> None:
        self.config = config
        self.rollout = rollout
        self.schedule = rollout.schedule
        self.group_size = group_size
        self.iterations = iterations
        self.step_loss = FlowStepLoss(config, rollout, rollout.train_config.sampler.guidance_scale)
        self.trained = self._trained_steps(0, 0)  # at the first iteration (for planning)

    @property
    def uses_reference(self) -> bool:
        return self.config.kl_beta > 0

    def _trained_steps(self, iteration: int, iterations: int) -> list[int]:
        s = self.schedule
        return self.config.trained_steps(
            s.num_steps, list(s.split_steps), list(s.ode_steps), iteration, iterations
        )

    def num_units(self, num_samples: int) -> int:
        trees = num_samples // self.group_size
        c = self.config
        return num_kept_edges(self.schedule, self.trained, trees, c.width_pruning, c.width_keep)

    def advantage_inputs(self, batch: TreeTrajectories) -> dict[str, torch.Tensor]:
        """The edges' log-probs along each leaf's path (``[n, T]``), for probability fusion."""
        if self.config.fusion == "mean":
            return {}
        trees = len(batch.prompts) // self.schedule.num_leaves
        return {"path_log_probs": per_leaf(batch.tree.log_probs, trees)}

    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        """``[N, T]`` edge advantages along every leaf's path, from the trees' raw leaf rewards
        (``genrl/objectives/tree_advantages.py``), clipped to ``+-advantage_clip``."""
        del prompts
        c, schedule = self.config, self.schedule
        leaves = schedule.num_leaves
        trees = len(rewards) // leaves
        ids = group_ids.view(trees, leaves)
        if not bool((ids == ids[:, :1]).all()):
            raise ValueError("branch_grpo expects each group's leaves to be contiguous")
        factors = [schedule.factor(t) for t in range(schedule.num_steps)]
        edge_log_probs = None
        if "path_log_probs" in inputs:
            lp = inputs["path_log_probs"].cpu().view(trees, leaves, -1)
            edge_log_probs = [
                from_leaves(lp[..., t].reshape(-1), schedule.edges(t), trees).view(trees, -1)
                for t in range(schedule.num_steps)
            ]
        values = node_values(rewards.cpu().view(trees, leaves), factors, c.fusion, edge_log_probs)
        depth = depthwise_advantages(
            values, eps=c.depth_eps, min_std=c.depth_min_std, std_estimator=c.depth_std_estimator
        )
        per_step = edge_advantages_per_leaf(depth).to(rewards.device)
        return clip_advantages(per_step, c.advantage_clip)

    def units(
        self, policy: FlowPolicy, batch: TreeTrajectories, noise: RolloutNoise
    ) -> FlowTransitions:
        del policy
        tree, schedule, c = batch.tree, self.schedule, self.config
        trees = len(batch.prompts) // schedule.num_leaves
        trained = self._trained_steps(noise.iteration, self.iterations)
        mode = c.width_pruning if c.prunes_at(noise.iteration, self.iterations) else "none"
        per_leaf_advantages = batch.advantages.float().cpu()
        edge_advantages = {
            t: from_leaves(per_leaf_advantages[:, t], schedule.edges(t), trees).view(trees, -1)
            for t in range(schedule.num_steps)
        }
        kept = kept_edges(schedule, trained, edge_advantages, mode, c.width_keep)
        device = tree.states[0].device
        parts: dict[str, list[torch.Tensor]] = {
            k: [] for k in ("rows", "sample", "next", "step", "old", "adv")
        }
        for t in trained:
            index = kept[t].to(device)
            parts["rows"].append(torch.div(index, schedule.edges(t), rounding_mode="floor"))
            parts["sample"].append(tree.states[t][tree.parents[t][index]])
            parts["next"].append(tree.next_states[t][index])
            parts["step"].append(torch.full((len(index),), t, device=device, dtype=torch.long))
            parts["old"].append(tree.log_probs[t][index])
            parts["adv"].append(edge_advantages[t].flatten().to(device)[index])
        return FlowTransitions(
            rows=torch.cat(parts["rows"]),
            conditions=SharedRows(batch.condition),
            sample=torch.cat(parts["sample"]),
            next_sample=torch.cat(parts["next"]),
            timestep_index=torch.cat(parts["step"]),
            old_log_probs=torch.cat(parts["old"]),
            advantages=torch.cat(parts["adv"]),
        )

    def loss(
        self, policy: FlowPolicy, minibatch: FlowTransitions, step: StepContext | None = None
    ) -> tuple[torch.Tensor, Metrics]:
        del step
        return self.step_loss(policy, minibatch)


__all__ = ["TreePolicyGradient", "TreePolicyGradientConfig"]
