"""BranchGRPO: Flow-GRPO on branching rollouts (Li et al. 2025, "BranchGRPO: Stable and
Efficient GRPO with Structured Branching in Diffusion Models").

Each prompt's group is the leaves of one tree (``samplers/tree.py``): one initial noise, split
into ``branching[k]`` children at ``split_steps[k]``, so the group shares prefixes and costs far
fewer model forwards. Leaf rewards are fused up the tree (an edge's value is the mean, or the
path-probability-weighted mean, of the leaves below it) and z-scored per depth within each tree
(``genrl/advantages.py: tree_values, depthwise_advantages``). Every trained edge is a Flow-GRPO
transition with the core clipped surrogate (and the same optional KL); split edges are re-scored
under the split sampler, the density they were drawn from.

Pruning changes what is trained, never the rollout: ``train_steps`` picks depths (all trainable
ones by default), ``depth_pruning`` leaves some out (optionally a window that slides earlier
during training, as the reference does), ``width_pruning="sibling_top"`` keeps, at each split, the ``width_keep``
fraction of every sibling group with the largest ``|advantage|``, ``"best_worst"`` the edges on
the paths to each tree's best and worst leaf, and ODE steps (``ode_steps``, the Mix variant) are
never trained. A depth-wise advantage is unchanged by an affine map of a
tree's leaf rewards, so it is computed from the per-leaf group advantages the trainer stores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from genrl.advantages import clip_advantages, depthwise_advantages, group_advantages, tree_values
from genrl.algorithms.base import RolloutNoise, register_algorithm
from genrl.algorithms.flow_grpo import FlowGRPO, FlowGRPOConfig
from genrl.algorithms.flow_rollout import decode_in_chunks
from genrl.overrides import ConfigError
from genrl.rollout import Batch, FlowTransitions, SharedRows
from samplers import SAMPLERS, FlowODESampler, StepOutput
from samplers.tree import TreeRollout, TreeSampler, TreeSchedule

TREE_NOISE_TAG = 50_000


@dataclass
class BranchGRPOConfig(FlowGRPOConfig):
    name: str = "branch_grpo"
    """Registry name."""
    split_steps: list[int] = field(default_factory=lambda: [0, 2, 4, 6])
    """Steps at which every node splits (BranchGRPO's branching points)."""
    branching: list[int] = field(default_factory=lambda: [2, 2, 2, 2])
    """Children per node at each split; their product must equal ``train.group_size``."""
    split_noise_level: float | None = None
    """Noise level of the split steps' sampler (more diverse siblings); None = the sampler's."""
    ode_steps: list[int] = field(default_factory=list)
    """Deterministic steps (BranchGRPO-Mix: ODE outside the branching region); never trained."""
    fusion: Literal["mean", "probability"] = "mean"
    """Edge value: mean of the leaves below, or weighted by the paths' probabilities."""
    train_steps: list[int] | None = None
    """Depth pruning: the steps whose edges are trained; None = every stochastic step."""
    depth_pruning: list[int] = field(default_factory=list)
    """Depth pruning as in the reference: steps left out of training (e.g. the last ones)."""
    depth_pruning_slide_every: int = 0
    """Slide the ``depth_pruning`` window one step earlier every this many iterations
    (0: fixed), until its first step reaches ``depth_pruning_stop``. The learning-rate schedule
    is planned with the first iteration's number of trained edges."""
    depth_pruning_stop: int | None = None
    """Earliest step the sliding window may reach; None = the last split step."""
    width_pruning: Literal["none", "sibling_top", "best_worst"] = "none"
    """Width pruning: ``sibling_top`` keeps, at split steps, each sibling group's top
    ``width_keep`` by |A|; ``best_worst`` keeps, at every trained step, the edges on the paths to
    each tree's best and worst leaf (an edge on both paths counts twice, so that every tree
    trains the same number of edges and processes stay in step)."""
    width_keep: float = 0.5
    """Fraction of each sibling group kept by ``sibling_top`` (rounded up)."""
    std_mode: Literal["group", "global", "none"] = "group"
    """Leaf advantages within each tree (depth-wise normalisation follows in any case)."""
    max_batch: int = 0
    """Nodes per model forward in the rollout (0: all live nodes of a step at once)."""

    def schedule(self, num_steps: int) -> TreeSchedule:
        return TreeSchedule(num_steps, tuple(self.split_steps), tuple(self.branching),
                            tuple(self.ode_steps))  # fmt: skip

    def validate(self, train_config: Any = None) -> None:
        super().validate(train_config)
        if not 0 < self.width_keep <= 1:
            raise ConfigError(f"algorithm.width_keep must lie in (0, 1], got {self.width_keep}")
        if train_config is None:
            return
        t, s = train_config.train, train_config.sampler
        try:
            schedule = self.schedule(s.num_steps)
        except ValueError as err:
            raise ConfigError(f"algorithm: {err}") from None
        if t.group_size != schedule.num_leaves:
            raise ConfigError(
                f"train.group_size ({t.group_size}) must equal the tree's leaves "
                f"(prod of algorithm.branching = {schedule.num_leaves})"
            )
        if s.sde_window_size:
            raise ConfigError(
                "branch_grpo: use algorithm.ode_steps instead of sampler.sde_window_*"
            )
        if t.dynamic_sampling:
            raise ConfigError(
                "branch_grpo trains whole trees: train.dynamic_sampling is not supported"
            )
        if self.depth_pruning_slide_every < 0:
            raise ConfigError("algorithm.depth_pruning_slide_every must be >= 0")
        trained = self.trained_steps(s.num_steps)
        if not trained:
            raise ConfigError(
                "branch_grpo: no step left to train (check train_steps and ode_steps)"
            )

    def trained_steps(self, num_steps: int, iteration: int = 0) -> list[int]:
        """The steps trained at ``iteration``: ``train_steps`` (or all) minus ODE steps and the
        depth-pruning window as slid by then."""
        steps = range(num_steps) if self.train_steps is None else self.train_steps
        bad = [s for s in [*steps, *self.depth_pruning] if not 0 <= s < num_steps]
        if bad:
            raise ConfigError(
                f"algorithm.train_steps / depth_pruning {bad} outside [0, {num_steps})"
            )
        pruned = set(self.pruned_depths(iteration))
        return [s for s in steps if s not in self.ode_steps and s not in pruned]

    def pruned_depths(self, iteration: int) -> list[int]:
        """``depth_pruning`` shifted ``iteration // depth_pruning_slide_every`` steps earlier, the
        shift capped so that the window starts no earlier than ``depth_pruning_stop``."""
        if not self.depth_pruning or not self.depth_pruning_slide_every:
            return sorted(self.depth_pruning)
        window = sorted(self.depth_pruning)
        stop = self.depth_pruning_stop
        if stop is None:
            stop = max(self.split_steps) if self.split_steps else 0
        shift = min(iteration // self.depth_pruning_slide_every, max(0, window[0] - stop))
        return [d - shift for d in window]


@dataclass
class TreeTrajectories(Batch):
    """The leaves of this process's trees (per-sample fields) and the trees themselves.

    Attributes:
        prompts: ``N = R * L`` prompts, tree-major.
        group_ids: ``[N]``.
        leaves: ``[N, *event]`` final latents.
        condition: the ``R`` trees' prompt encodings (``[R, ...]`` tensors).
        tree: the tree rollout (states, edges, log-probs per step).
        advantages: ``[N]`` leaf advantages (filled by the trainer).
    """

    prompts: list[str]
    group_ids: torch.Tensor
    leaves: torch.Tensor
    condition: dict[str, torch.Tensor]
    tree: TreeRollout
    advantages: torch.Tensor = field(default_factory=lambda: torch.zeros(0))


@register_algorithm("branch_grpo")
class BranchGRPO(FlowGRPO):
    Config = BranchGRPOConfig
    config: BranchGRPOConfig

    def setup(self, policy: Any) -> None:
        """The tree sampler on the policy's noise schedule."""
        s, c = self.train_config.sampler, self.config
        sigmas = policy.sigma_schedule(s.num_steps, s.shift)
        sampler_cls = SAMPLERS[s.name]
        base = sampler_cls(sigmas, s.noise_level, log_prob_reduction=s.log_prob_reduction)
        split_level = s.noise_level if c.split_noise_level is None else c.split_noise_level
        split = sampler_cls(sigmas, split_level, log_prob_reduction=s.log_prob_reduction)
        self.schedule = c.schedule(s.num_steps)
        self.tree_sampler = TreeSampler(self.schedule, base, split, FlowODESampler(sigmas))
        self.trained = c.trained_steps(s.num_steps)  # at the first iteration (for planning)

    @property
    def sampler(self) -> Any:
        return self.tree_sampler.sampler

    def _kept_per_step(self, step: int) -> int:
        """Edges per tree trained at ``step`` after width pruning."""
        edges, factor = self.schedule.edges(step), self.schedule.factor(step)
        if self.config.width_pruning == "best_worst":
            return 2
        if self.config.width_pruning == "sibling_top" and factor > 1:
            return edges // factor * math.ceil(self.config.width_keep * factor)
        return edges

    def num_units(self, num_samples: int) -> int:
        trees = num_samples // self.train_config.train.group_size
        return trees * sum(self._kept_per_step(t) for t in self.trained)

    @torch.no_grad()
    def collect(
        self, policy: Any, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> TreeTrajectories:
        group = self.train_config.train.group_size
        if len(prompts) % group or len(set(group_ids[::group].tolist())) != len(prompts) // group:
            raise ValueError(
                "branch_grpo grows one tree per group on one process: make "
                "train.prompts_per_iteration divisible by the number of processes"
            )
        device, shape = policy.device, tuple(policy.latent_shape)
        roots = group_ids[::group]
        condition = policy.encode_prompts(list(prompts[::group]))
        rows = SharedRows(condition)
        initial = noise.randn_per_group(
            0, shape, roots, self.train_config.train.prompts_per_iteration, device
        )
        sigmas = self.sampler.sigmas.to(device)
        guidance = self.guidance_scale

        def velocity(x: torch.Tensor, step: int, trees: torch.Tensor) -> torch.Tensor:
            return policy.velocity(x, sigmas[step].expand(len(x)), rows.rows(trees), guidance)

        def draws(step: int, n: int, event: tuple[int, ...]) -> torch.Tensor:
            if n == noise.num_local:  # one edge per sample: Flow-GRPO's per-step stream
                return noise.randn(step + 1, event)
            # One stream per tree, keyed by its group id: a tree grows the same on any number
            # of processes (edges are tree-major).
            per_tree = n // len(roots)
            return torch.cat(
                [
                    torch.randn(
                        (per_tree, *event),
                        generator=noise.generator(TREE_NOISE_TAG + step * 100_003 + 7 * int(g)),
                    )
                    for g in roots.tolist()
                ]
            )

        tree = self.tree_sampler.rollout(velocity, initial, draws, self.config.max_batch)
        return TreeTrajectories(
            prompts=list(prompts),
            group_ids=group_ids,
            leaves=tree.leaves,
            condition=condition,
            tree=tree,
            advantages=torch.zeros(len(prompts), device=device),
        )

    def final_outputs(self, policy: Any, rollout: TreeTrajectories) -> torch.Tensor:  # type: ignore[override]
        return decode_in_chunks(policy, rollout.leaves, self.train_config.train.rollout_batch_size)

    def advantages(
        self, rewards: torch.Tensor, prompts: list[str], group_ids: torch.Tensor
    ) -> torch.Tensor:
        del prompts
        return group_advantages(rewards, group_ids, std_mode=self.config.std_mode)

    def training_units(self, rollout: TreeTrajectories, noise: RolloutNoise) -> FlowTransitions:  # type: ignore[override]
        tree, schedule = rollout.tree, self.schedule
        num_trees = len(rollout.prompts) // schedule.num_leaves
        leaf_values = rollout.advantages.float().cpu().view(num_trees, schedule.num_leaves)
        edges = [schedule.edges(t) for t in range(schedule.num_steps)]
        log_probs = None
        if self.config.fusion == "probability":
            log_probs = [
                lp.cpu().view(num_trees, e) for lp, e in zip(tree.log_probs, edges, strict=True)
            ]
        depth_advantages = depthwise_advantages(tree_values(leaf_values, edges, log_probs))
        parts: dict[str, list[torch.Tensor]] = {
            k: [] for k in ("rows", "sample", "next", "step", "old", "adv")
        }
        device = tree.states[0].device
        best_worst = torch.stack([leaf_values.argmax(1), leaf_values.argmin(1)], dim=1)  # [R, 2]
        trained = self.config.trained_steps(schedule.num_steps, noise.iteration)
        for t in trained:
            advantage = depth_advantages[t]  # [R, E_t]
            if self.config.width_pruning == "best_worst":
                # The edge of step t on the path to leaf l is l // (leaves per edge).
                on_path = best_worst // (schedule.num_leaves // edges[t])
                offsets = torch.arange(num_trees)[:, None] * edges[t]
                index = (on_path + offsets).flatten().to(device)
            else:
                keep = self._keep_mask(advantage, schedule.factor(t)).flatten().to(device)
                index = keep.nonzero()[:, 0]
            parent = tree.parents[t][index]
            parts["rows"].append(torch.div(index, edges[t], rounding_mode="floor"))
            parts["sample"].append(tree.states[t][parent])
            parts["next"].append(tree.next_states[t][index])
            parts["step"].append(torch.full((len(index),), t, device=device, dtype=torch.long))
            parts["old"].append(tree.log_probs[t][index])
            parts["adv"].append(advantage.flatten().to(device)[index])
        advantages = clip_advantages(torch.cat(parts["adv"]), self.config.advantage_clip)
        return FlowTransitions(
            rows=torch.cat(parts["rows"]),
            conditions=SharedRows(rollout.condition),
            sample=torch.cat(parts["sample"]),
            next_sample=torch.cat(parts["next"]),
            timestep_index=torch.cat(parts["step"]),
            old_log_probs=torch.cat(parts["old"]),
            advantages=advantages,
        )

    def _keep_mask(self, advantage: torch.Tensor, factor: int) -> torch.Tensor:
        """``[R, E]`` bool: the edges trained at one step (sibling groups are consecutive)."""
        if self.config.width_pruning != "sibling_top" or factor == 1:
            return torch.ones_like(advantage, dtype=torch.bool)
        num_trees, edges = advantage.shape
        groups = advantage.abs().view(num_trees, edges // factor, factor)
        keep = math.ceil(self.config.width_keep * factor)
        top = groups.topk(keep, dim=-1).indices
        mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, top, True)
        return mask.view(num_trees, edges)

    def rescore(self, velocity: torch.Tensor, mb: FlowTransitions) -> Any:
        """Flow-GRPO's loss re-scores each edge here: under the split sampler at split steps
        (the density the children were drawn from), under the step sampler elsewhere."""
        base = self.tree_sampler.sampler.step(
            velocity, mb.timestep_index, mb.sample, prev_sample=mb.next_sample
        )
        split_steps = torch.tensor(
            self.schedule.split_steps, device=mb.sample.device, dtype=torch.long
        )
        is_split = torch.isin(mb.timestep_index, split_steps)
        if not bool(is_split.any()):
            return base
        split = self.tree_sampler.split_sampler.step(
            velocity, mb.timestep_index, mb.sample, prev_sample=mb.next_sample
        )
        rows = is_split.view(-1, *[1] * (base.mean.ndim - 1))
        return StepOutput(
            prev_sample=base.prev_sample,
            log_prob=torch.where(is_split, split.log_prob, base.log_prob),
            mean=torch.where(rows, split.mean, base.mean),
            std=torch.where(is_split, split.std, base.std),
        )

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


__all__ = ["BranchGRPO", "BranchGRPOConfig", "TreeTrajectories"]
