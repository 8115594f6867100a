"""Branching rollouts (BranchGRPO: Li et al. 2025): one tree per prompt, whose leaves are the
group (``samplers/tree.py`` grows it, all live nodes of a step in one forward).

Split steps follow the reference (Fredreic1849/BranchGRPO, ``train_branchgrpo_flux.py``): the
children keep the base step's drift and only their noise is multiplied by the split noise scale,
and they are scored under the base density (``split_log_prob="drawn"`` scores them under the
density they were drawn from; a split noise level instead runs a whole sampler of another noise
level at the splits). ``rescore`` scores an edge under the step that drew it.
"""

from __future__ import annotations

from typing import Any

import torch

from genrl.data.batches import FlowTransitions, SharedRows, TreeTrajectories
from genrl.data.rng import RolloutNoise, Streams
from genrl.policies.protocols import FlowPolicy
from genrl.rollouts.configs import BranchingRolloutConfig
from genrl.rollouts.flow import FlowRollout
from samplers import SAMPLERS, FlowODESampler, StepOutput
from samplers.scaled_noise import ScaledNoiseSampler
from samplers.tree import TreeSampler


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
