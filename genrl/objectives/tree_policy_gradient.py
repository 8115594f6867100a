"""BranchGRPO's objective (Li et al. 2025): depth-wise advantages of a tree's edges, pruning,
and the flow-step loss of every trained edge (``genrl/objectives/flow_steps.py``).

Leaf rewards are fused up each tree and z-scored depth by depth (``genrl/objectives/tree_advantages.py``,
following the reference code's conventions). The advantages travel as ``[N, T]`` per leaf and
step: entry ``(l, t)`` is the advantage of the edge of step ``t`` on the path to leaf ``l``.
Pruning changes what is trained, never the rollout (``genrl/objectives/tree_pruning.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from genrl.config.errors import ConfigError
from genrl.data.batches import FlowTransitions, SharedRows, TreeTrajectories
from genrl.data.rng import RolloutNoise
from genrl.objectives.advantages import clip_advantages
from genrl.objectives.base import Objective, StepContext
from genrl.objectives.flow_steps import FlowStepLoss, FlowStepLossConfig
from genrl.objectives.losses import Metrics
from genrl.objectives.tree_advantages import (
    FUSIONS,
    depthwise_advantages,
    edge_advantages_per_leaf,
    from_leaves,
    node_values,
    per_leaf,
)
from genrl.objectives.tree_pruning import (
    WIDTH_PRUNING,
    WidthPruning,
    kept_edges,
    num_kept_edges,
    pruned_depths,
)
from genrl.policies.protocols import FlowPolicy


@dataclass
class TreePolicyGradientConfig(FlowStepLossConfig):
    """Fields of BranchGRPO's objective (besides the step loss's)."""

    fusion: Literal["mean", "probability", "path_probability"] = "mean"
    """Node values from the leaves: their mean; the reference's probability weighting (at each
    split node, a softmax over its children's edge log-probs, level by level); or the mean
    weighted by each leaf's whole path probability below the node (an earlier genrl variant)."""
    train_steps: list[int] | None = None
    """Steps whose edges are trained; None = every stochastic step (the paper's method and the
    reference's README)."""
    depth_pruning: list[int] = field(default_factory=list)
    """Child depths left out of training, as the reference's ``--depth_pruning``: the edges of
    sampling step ``t`` enter depth ``t + 1`` (e.g. ``[15, 16, 17]`` of 20 steps)."""
    depth_pruning_slide_every: int = 0
    """Slide the pruned depths one depth shallower every this many iterations (0: fixed), until
    the first reaches ``depth_pruning_stop``. The LR schedule is planned with the first
    iteration's number of trained edges."""
    depth_pruning_stop: int | None = None
    """Shallowest depth the sliding window may reach; None = the last split step (the
    reference's default ``max(split_points)``)."""
    width_pruning: WidthPruning = "none"
    """``last_split_top`` and ``last_split_best_worst``: the reference's modes 1 and 2 on the
    transitions after the last split; ``sibling_top`` and ``best_worst_paths``: genrl's own
    (``genrl/objectives/tree_pruning.py``)."""
    width_keep: float = 0.5
    """Kept fraction of width pruning (the reference's ``--width_pruning_ratio``, 0.5)."""
    pruning_fraction: float = 1.0
    """Prune during the first this fraction of ``train.iterations`` only (the reference's
    ``--pruning_step_ratio``; 1 = always)."""
    depth_eps: float = 1e-8
    """Added to each depth's std (the reference: 1e-8)."""
    depth_min_std: float = 1e-6
    """A depth whose std is below this gets advantage 0 (the reference: 1e-6)."""
    depth_std_estimator: Literal["sample", "population"] = "sample"
    """Std of each depth's node values (the reference: ``torch.std``, Bessel)."""
    kl_beta: float = 0.0
    """KL weight on the step means; the reference has no KL term."""

    def validate_objective(self, split_steps: list[int], num_steps: int | None) -> None:
        if not 0 < self.width_keep <= 1:
            raise ConfigError(f"algorithm.width_keep must lie in (0, 1], got {self.width_keep}")
        if not 0 <= self.pruning_fraction <= 1:
            raise ConfigError(
                f"algorithm.pruning_fraction must lie in [0, 1], got {self.pruning_fraction}"
            )
        if self.fusion not in FUSIONS or self.width_pruning not in WIDTH_PRUNING:
            raise ConfigError(
                f"algorithm.fusion must be one of {FUSIONS}, width_pruning one of {WIDTH_PRUNING}"
            )
        if self.width_pruning.startswith("last_split") and not split_steps:
            raise ConfigError(f"algorithm.width_pruning={self.width_pruning} needs a split step")
        if self.depth_eps < 0 or self.depth_min_std < 0:
            raise ConfigError("algorithm.depth_eps and depth_min_std must be >= 0")
        if self.depth_pruning_slide_every < 0:
            raise ConfigError("algorithm.depth_pruning_slide_every must be >= 0")
        if num_steps is None:
            return
        bad = [d for d in self.depth_pruning if not 1 <= d <= num_steps]
        if bad:
            raise ConfigError(
                f"algorithm.depth_pruning {bad}: child depths lie in [1, {num_steps}] (the "
                "edges of step t enter depth t + 1)"
            )

    def trained_steps(
        self,
        num_steps: int,
        split_steps: list[int],
        ode_steps: list[int],
        iteration: int = 0,
        iterations: int = 0,
    ) -> list[int]:
        """The steps trained at ``iteration`` of ``iterations``: ``train_steps`` (or all) minus ODE
        steps and, while pruning applies, the steps entering a pruned depth."""
        steps = range(num_steps) if self.train_steps is None else self.train_steps
        bad = [s for s in steps if not 0 <= s < num_steps]
        if bad:
            raise ConfigError(f"algorithm.train_steps {bad} outside [0, {num_steps})")
        pruned: set[int] = set()
        if self.prunes_at(iteration, iterations):
            stop = self.depth_pruning_stop
            if stop is None:
                stop = max(split_steps) if split_steps else 0
            window = pruned_depths(
                self.depth_pruning, self.depth_pruning_slide_every, stop, iteration
            )
            pruned = set(window)
        return sorted(s for s in steps if s not in ode_steps and s + 1 not in pruned)

    def prunes_at(self, iteration: int, iterations: int) -> bool:
        """Whether pruning applies at ``iteration`` (the reference prunes while
        ``step <= int(max_steps * pruning_step_ratio)``)."""
        return iterations == 0 or iteration <= int(iterations * self.pruning_fraction)


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
