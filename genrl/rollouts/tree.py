"""Branching rollouts (BranchGRPO: Li et al. 2025): one tree per prompt, whose leaves are the
group (``samplers/tree.py`` grows it, all live nodes of a step in one forward).

Split steps follow the reference (Fredreic1849/BranchGRPO, ``train_branchgrpo_flux.py``): the
children keep the base step's drift and only their noise is multiplied by the split noise scale,
and they are scored under the base density (``split_log_prob="drawn"`` scores them under the
density they were drawn from; a split noise level instead runs a whole sampler of another noise
level at the splits). ``rescore`` scores an edge under the step that drew it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from genrl.config.errors import ConfigError
from genrl.data.batches import FlowTransitions, SharedRows, TreeTrajectories
from genrl.data.rng import RolloutNoise, Streams
from genrl.policies.protocols import FlowPolicy
from genrl.rollouts.flow import FlowRollout
from samplers import SAMPLERS, FlowODESampler, StepOutput
from samplers.scaled_noise import ScaledNoiseSampler
from samplers.tree import TreeSampler, TreeSchedule


@dataclass
class BranchingRolloutConfig:
    """Fields of the tree rollout (BranchGRPO documents its defaults)."""

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
    max_batch: int = 0
    """Nodes per model forward in the rollout (0: all live nodes of a step at once)."""

    def schedule(self, num_steps: int) -> TreeSchedule:
        return TreeSchedule(num_steps, tuple(self.split_steps), tuple(self.branching),
                            tuple(self.ode_steps))  # fmt: skip

    def validate_rollout(self, train_config: Any = None) -> None:
        """Raise ``ConfigError`` naming the field that cannot work."""
        if not self.split_noise_scale > 0:
            raise ConfigError(
                f"algorithm.split_noise_scale must be > 0, got {self.split_noise_scale}"
            )
        if self.split_noise_level is not None and self.split_noise_scale != 1:
            raise ConfigError(
                "algorithm.split_noise_level and split_noise_scale are two ways to widen the "
                "splits: set one of them"
            )
        if self.max_batch < 0:
            raise ConfigError(f"algorithm.max_batch must be >= 0, got {self.max_batch}")
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
        if t.dynamic_sampling:
            raise ConfigError(
                "branch_grpo trains whole trees: train.dynamic_sampling is not supported"
            )


class BranchingRollout(FlowRollout[TreeTrajectories]):
    """Trees on the policy's noise schedule with ``train_config.sampler``'s step.

    Args:
        config: the tree's fields (where it splits, the split steps, ODE steps, batching).
        train_config: the run's config (``sampler``, ``train``, ``eval``).
        policy: the flow policy (its noise schedule).
    """

    def __init__(
        self, config: BranchingRolloutConfig, train_config: Any, policy: FlowPolicy
    ) -> None:
        super().__init__(train_config)
        s = train_config.sampler
        sigmas = policy.sigma_schedule(s.num_steps, s.shift)
        sampler_cls = SAMPLERS[s.name]
        base = sampler_cls(sigmas, s.noise_level, log_prob_reduction=s.log_prob_reduction)
        if config.split_noise_level is not None:
            split: Any = sampler_cls(
                sigmas, config.split_noise_level, log_prob_reduction=s.log_prob_reduction
            )
        else:
            split = ScaledNoiseSampler(base, config.split_noise_scale, config.split_log_prob)
        self.schedule = config.schedule(s.num_steps)
        self.tree_sampler = TreeSampler(self.schedule, base, split, FlowODESampler(sigmas))
        self.max_batch = config.max_batch

    @property
    def sampler(self) -> Any:
        """The step of non-split edges (``sigmas``, ``log_prob_reduction``, ``reference_std``)."""
        return self.tree_sampler.sampler

    @torch.no_grad()
    def collect(
        self, policy: FlowPolicy, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
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
            Streams.INITIAL_NOISE,
            shape,
            roots,
            self.train_config.train.prompts_per_iteration,
            device,
        )
        sigmas = self.sampler.sigmas.to(device)
        guidance = self.train_config.sampler.guidance_scale

        def velocity(x: torch.Tensor, step: int, trees: torch.Tensor) -> torch.Tensor:
            return policy.velocity(x, sigmas[step].expand(len(x)), rows.rows(trees), guidance)

        def draws(step: int, n: int, event: tuple[int, ...]) -> torch.Tensor:
            if n == noise.num_local:  # one edge per sample: Flow-GRPO's per-step stream
                return noise.randn((Streams.STEP_NOISE, step), event)
            # One stream per tree, keyed by its group id: a tree grows the same on any number
            # of processes (edges are tree-major).
            per_tree = n // len(roots)
            return torch.cat(
                [
                    torch.randn(
                        (per_tree, *event),
                        generator=noise.generator((Streams.TREE_EDGES, step, int(g))),
                    )
                    for g in roots.tolist()
                ]
            )

        tree = self.tree_sampler.rollout(velocity, initial, draws, self.max_batch)
        return TreeTrajectories(
            prompts=list(prompts),
            group_ids=group_ids,
            leaves=tree.leaves,
            condition=condition,
            tree=tree,
            advantages=torch.zeros(len(prompts), self.schedule.num_steps, device=device),
        )

    def rescore(self, velocity: torch.Tensor, units: FlowTransitions) -> StepOutput:
        """Each edge's step output under ``velocity``: under the split step at split steps (the
        density the children are scored under), under the step sampler elsewhere."""
        base = self.sampler.step(
            velocity, units.timestep_index, units.sample, prev_sample=units.next_sample
        )
        split_steps = torch.tensor(
            self.schedule.split_steps, device=units.sample.device, dtype=torch.long
        )
        is_split = torch.isin(units.timestep_index, split_steps)
        if not bool(is_split.any()):
            return base
        split = self.tree_sampler.split_sampler.step(  # type: ignore[attr-defined]
            velocity, units.timestep_index, units.sample, prev_sample=units.next_sample
        )
        rows = is_split.view(-1, *[1] * (base.mean.ndim - 1))
        return StepOutput(
            prev_sample=base.prev_sample,
            log_prob=torch.where(is_split, split.log_prob, base.log_prob),
            mean=torch.where(rows, split.mean, base.mean),
            std=torch.where(is_split, split.std, base.std),
        )


__all__ = ["BranchingRollout"]
