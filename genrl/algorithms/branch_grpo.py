"""BranchGRPO: Flow-GRPO on branching rollouts (Li et al. 2025, "BranchGRPO: Stable and
Efficient GRPO with Structured Branching in Diffusion Models").

Each prompt's group is the leaves of one tree (``samplers/tree.py``): one initial noise, split
into ``branching[k]`` children at ``split_steps[k]``, so the group shares prefixes and costs far
fewer model forwards. Leaf rewards are fused up the tree and z-scored depth by depth within each
tree (``genrl/tree_advantages.py``, following the reference code's conventions); every trained
edge is a Flow-GRPO transition with the core clipped surrogate (and the same optional KL).

Split steps follow the reference (Fredreic1849/BranchGRPO, ``train_branchgrpo_flux.py``): the
children keep the base step's drift and only their noise is multiplied by ``split_noise_scale``,
and they are scored under the base density (``split_log_prob="drawn"`` scores them under the
density they were drawn from; ``split_noise_level`` instead runs a whole sampler of another noise
level at the splits, an earlier genrl variant).

Pruning changes what is trained, never the rollout (``genrl/algorithms/tree_pruning.py``):
``train_steps`` picks steps, ``depth_pruning`` leaves out child depths (optionally a window that
slides shallower during training), ``width_pruning`` keeps some edges of a depth, and ODE steps
(``ode_steps``, the Mix variant) are never trained.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from genrl.advantages import clip_advantages
from genrl.algorithms.base import RolloutNoise, register_algorithm
from genrl.algorithms.flow_grpo import FlowGRPO, FlowGRPOConfig
from genrl.algorithms.flow_rollout import decode_in_chunks
from genrl.algorithms.tree_pruning import (
    WIDTH_PRUNING,
    WidthPruning,
    kept_edges,
    num_kept_edges,
    pruned_depths,
)
from genrl.overrides import ConfigError
from genrl.rollout import Batch, FlowTransitions, SharedRows
from genrl.tree_advantages import (
    FUSIONS,
    depthwise_advantages,
    edge_advantages_per_leaf,
    from_leaves,
    node_values,
    per_leaf,
)
from samplers import SAMPLERS, FlowODESampler, StepOutput
from samplers.scaled_noise import ScaledNoiseSampler
from samplers.tree import TreeRollout, TreeSampler, TreeSchedule

TREE_NOISE_TAG = 50_000


@dataclass
class BranchGRPOConfig(FlowGRPOConfig):
    name: str = "branch_grpo"
    """Registry name."""
    split_steps: list[int] = field(default_factory=lambda: [0, 2, 4, 6])
    """Steps at which every node splits (the reference's ``--tree_split_points``)."""
    branching: list[int] = field(default_factory=lambda: [2, 2, 2, 2])
    """Children per node at each split (the reference always splits in 2); their product must
    equal ``train.group_size``."""
    split_noise_scale: float = 1.0
    """Multiplier of the noise of the split steps, drift unchanged (the reference's
    ``--tree_split_noise_scale``; its FLUX script uses 4)."""
    split_log_prob: Literal["base", "drawn"] = "base"
    """Density split edges are scored under: the base step's (the reference) or the one they
    were drawn from, with the noise scaled."""
    split_noise_level: float | None = None
    """Instead of scaling the noise, run the split steps with a sampler of this noise level (its
    own drift and density); None keeps the reference's scaled noise."""
    ode_steps: list[int] = field(default_factory=list)
    """Deterministic steps (BranchGRPO-Mix: ODE outside the branching region); never trained."""
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
    (``genrl/algorithms/tree_pruning.py``)."""
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
    max_batch: int = 0
    """Nodes per model forward in the rollout (0: all live nodes of a step at once)."""

    def schedule(self, num_steps: int) -> TreeSchedule:
        return TreeSchedule(num_steps, tuple(self.split_steps), tuple(self.branching),
                            tuple(self.ode_steps))  # fmt: skip

    def validate(self, train_config: Any = None) -> None:
        super().validate(train_config)
        if not 0 < self.width_keep <= 1:
            raise ConfigError(f"algorithm.width_keep must lie in (0, 1], got {self.width_keep}")
        if not 0 <= self.pruning_fraction <= 1:
            raise ConfigError(
                f"algorithm.pruning_fraction must lie in [0, 1], got {self.pruning_fraction}"
            )
        if not self.split_noise_scale > 0:
            raise ConfigError(
                f"algorithm.split_noise_scale must be > 0, got {self.split_noise_scale}"
            )
        if self.split_noise_level is not None and self.split_noise_scale != 1:
            raise ConfigError(
                "algorithm.split_noise_level and split_noise_scale are two ways to widen the "
                "splits: set one of them"
            )
        if self.fusion not in FUSIONS or self.width_pruning not in WIDTH_PRUNING:
            raise ConfigError(
                f"algorithm.fusion must be one of {FUSIONS}, width_pruning one of {WIDTH_PRUNING}"
            )
        if self.width_pruning.startswith("last_split") and not self.split_steps:
            raise ConfigError(f"algorithm.width_pruning={self.width_pruning} needs a split step")
        if self.depth_eps < 0 or self.depth_min_std < 0:
            raise ConfigError("algorithm.depth_eps and depth_min_std must be >= 0")
        if self.ratio_norm or self.kl_reward:
            raise ConfigError("branch_grpo supports neither algorithm.ratio_norm nor kl_reward")
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
        bad = [d for d in self.depth_pruning if not 1 <= d <= s.num_steps]
        if bad:
            raise ConfigError(
                f"algorithm.depth_pruning {bad}: child depths lie in [1, {s.num_steps}] (the "
                "edges of step t enter depth t + 1)"
            )
        if not self.trained_steps(s.num_steps):
            raise ConfigError(
                "branch_grpo: no step left to train (check train_steps and ode_steps)"
            )

    def trained_steps(self, num_steps: int, iteration: int = 0, iterations: int = 0) -> list[int]:
        """The steps trained at ``iteration`` of ``iterations``: ``train_steps`` (or all) minus ODE
        steps and, while pruning applies, the steps entering a pruned depth."""
        steps = range(num_steps) if self.train_steps is None else self.train_steps
        bad = [s for s in steps if not 0 <= s < num_steps]
        if bad:
            raise ConfigError(f"algorithm.train_steps {bad} outside [0, {num_steps})")
        pruned = set()
        if self.prunes_at(iteration, iterations):
            stop = self.depth_pruning_stop
            if stop is None:
                stop = max(self.split_steps) if self.split_steps else 0
            pruned = set(
                pruned_depths(self.depth_pruning, self.depth_pruning_slide_every, stop, iteration)
            )
        return sorted(s for s in steps if s not in self.ode_steps and s + 1 not in pruned)

    def prunes_at(self, iteration: int, iterations: int) -> bool:
        """Whether pruning applies at ``iteration`` (the reference prunes while
        ``step <= int(max_steps * pruning_step_ratio)``)."""
        return iterations == 0 or iteration <= int(iterations * self.pruning_fraction)


@dataclass
class TreeTrajectories(Batch):
    """The leaves of this process's trees (per-sample fields) and the trees themselves.

    Attributes:
        prompts: ``N = R * L`` prompts, tree-major.
        group_ids: ``[N]``.
        leaves: ``[N, *event]`` final latents.
        condition: the ``R`` trees' prompt encodings (``[R, ...]`` tensors).
        tree: the tree rollout (states, edges, log-probs per step).
        advantages: ``[N, T]``: entry ``(l, t)`` is the advantage of the edge of step ``t`` on
            the path to leaf ``l`` (filled by the trainer).
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
        if c.split_noise_level is not None:
            split: Any = sampler_cls(
                sigmas, c.split_noise_level, log_prob_reduction=s.log_prob_reduction
            )
        else:
            split = ScaledNoiseSampler(base, c.split_noise_scale, c.split_log_prob)
        self.schedule = c.schedule(s.num_steps)
        self.tree_sampler = TreeSampler(self.schedule, base, split, FlowODESampler(sigmas))
        self.trained = c.trained_steps(s.num_steps)  # at the first iteration (for planning)

    @property
    def sampler(self) -> Any:
        return self.tree_sampler.sampler

    def num_units(self, num_samples: int) -> int:
        trees = num_samples // self.train_config.train.group_size
        c = self.config
        return num_kept_edges(self.schedule, self.trained, trees, c.width_pruning, c.width_keep)

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
            advantages=torch.zeros(len(prompts), self.schedule.num_steps, device=device),
        )

    def final_outputs(self, policy: Any, rollout: TreeTrajectories) -> torch.Tensor:  # type: ignore[override]
        return decode_in_chunks(policy, rollout.leaves, self.train_config.train.rollout_batch_size)

    def advantage_inputs(self, rollout: TreeTrajectories) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """The edges' log-probs along each leaf's path (``[n, T]``), for probability fusion."""
        if self.config.fusion == "mean":
            return {}
        trees = len(rollout.prompts) // self.schedule.num_leaves
        return {"path_log_probs": per_leaf(rollout.tree.log_probs, trees)}

    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        """``[N, T]`` edge advantages along every leaf's path, from the trees' raw leaf rewards
        (``genrl/tree_advantages.py``), clipped to ``+-advantage_clip``."""
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

    def training_units(self, rollout: TreeTrajectories, noise: RolloutNoise) -> FlowTransitions:  # type: ignore[override]
        tree, schedule, c = rollout.tree, self.schedule, self.config
        trees = len(rollout.prompts) // schedule.num_leaves
        iterations = self.train_config.train.iterations
        trained = c.trained_steps(schedule.num_steps, noise.iteration, iterations)
        mode = c.width_pruning if c.prunes_at(noise.iteration, iterations) else "none"
        per_leaf_advantages = rollout.advantages.float().cpu()
        edge_advantages = {
            t: from_leaves(per_leaf_advantages[:, t], schedule.edges(t), trees).view(trees, -1)
            for t in range(schedule.num_steps)
        }
        kept = kept_edges(schedule, trained, edge_advantages, mode, c.width_keep)
        device = tree.states[0].device
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("rows", "sample", "next", "step", "old", "adv")}  # fmt: skip
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
            conditions=SharedRows(rollout.condition),
            sample=torch.cat(parts["sample"]),
            next_sample=torch.cat(parts["next"]),
            timestep_index=torch.cat(parts["step"]),
            old_log_probs=torch.cat(parts["old"]),
            advantages=torch.cat(parts["adv"]),
        )

    def rescore(self, velocity: torch.Tensor, mb: FlowTransitions) -> Any:
        """Flow-GRPO's loss re-scores each edge here: under the split step at split steps (the
        density the children are scored under), under the step sampler elsewhere."""
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
