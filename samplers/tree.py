"""Branching rollouts for flow models (BranchGRPO: Li et al. 2025, "BranchGRPO: Stable and
Efficient GRPO with Structured Branching in Diffusion Models").

Instead of ``G`` independent trajectories per prompt, one trajectory starts from the prompt's
initial noise and splits at chosen steps: at a split step every live node takes ``b`` independent
stochastic steps, one per child, so the children share the whole prefix before the split. With
splits ``(s_1, ..., s_k)`` and factors ``(b_1, ..., b_k)`` a tree has ``prod b_j`` leaves (the
group) and far fewer model evaluations than ``prod b_j`` full trajectories.

Layout. Nodes are numbered depth by depth and, within a depth, tree by tree; the children of a
node are consecutive, so the leaves below a node at any depth form one contiguous block. Step
``t`` moves the ``width(t)`` nodes of each tree to ``edges(t)`` children (``width(t) * b`` at a
split, ``width(t)`` otherwise); every such transition is an *edge* with a parent, the log-prob its
step's sampler reports (at split steps the split sampler's: with ``ScaledNoiseSampler`` the base
step's density by default, or the widened one it was drawn from, ``samplers/scaled_noise.py``),
and a trainable flag (False on ODE steps of the Mix variant).

All live nodes of all trees at one step go through the model together (one batched forward,
chunked to ``max_batch``), unlike the reference code that evaluates one node per forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from samplers.tree_schedule import TreeSchedule

# (states [n, *event], step index, tree of each state [n]) -> velocity [n, *event]
VelocityFn = Callable[[torch.Tensor, int, torch.Tensor], torch.Tensor]
# (step index, number of draws, shape of one draw) -> standard-normal noise [n, *event]
NoiseFn = Callable[[int, int, tuple[int, ...]], torch.Tensor]


@dataclass
class TreeRollout:
    """One step's batch of edges per entry (``T`` entries), over ``R`` trees.

    Attributes:
        states: ``T`` tensors ``[R * width(t), *event]``: the nodes entering step ``t``.
        next_states: ``T`` tensors ``[R * edges(t), *event]``: the children after step ``t``
            (``next_states[-1]``: the ``R * L`` leaves, tree-major).
        parents: ``T`` long tensors ``[R * edges(t)]`` into ``states[t]``.
        log_probs: ``T`` float32 tensors ``[R * edges(t)]``, the log-prob each step's sampler
            reported for the edge (see the module docstring for split steps).
        trainable: ``[T]`` bool, False on ODE steps.
        split: ``[T]`` bool, True where the split sampler drew the step.
    """

    states: list[torch.Tensor]
    next_states: list[torch.Tensor]
    parents: list[torch.Tensor]
    log_probs: list[torch.Tensor]
    trainable: torch.Tensor
    split: torch.Tensor

    @property
    def leaves(self) -> torch.Tensor:
        return self.next_states[-1]

    @property
    def forwards(self) -> int:
        """Node evaluations (rows through the model)."""
        return sum(int(s.shape[0]) for s in self.states)


class TreeSampler:
    """Runs a ``TreeSchedule`` on top of any stochastic flow step.

    Args:
        schedule: where to split.
        sampler: the stochastic step of non-split steps (e.g. ``FlowSDESampler``).
        split_sampler: the step at split steps (e.g. the same kind with a larger noise level);
            None uses ``sampler``. Split edges are scored under this sampler's density.
        ode_sampler: the deterministic step of ``schedule.ode_steps`` (``FlowODESampler``).
    """

    def __init__(
        self,
        schedule: TreeSchedule,
        sampler: object,
        split_sampler: object | None = None,
        ode_sampler: object | None = None,
    ) -> None:
        if schedule.ode_steps and ode_sampler is None:
            raise ValueError("the schedule has ODE steps: give an ode_sampler")
        for s in (sampler, split_sampler, ode_sampler):
            if s is not None and s.num_steps != schedule.num_steps:  # type: ignore[attr-defined]
                raise ValueError(
                    f"sampler has {s.num_steps} steps but the schedule {schedule.num_steps}"  # type: ignore[attr-defined]
                )
        self.schedule = schedule
        self.sampler = sampler
        self.split_sampler = split_sampler or sampler
        self.ode_sampler = ode_sampler

    def sampler_for(self, step: int) -> object:
        """The step function that drew (and re-scores) the edges of ``step``."""
        if step in self.schedule.ode_steps:
            return self.ode_sampler
        if step in self.schedule.split_steps:
            return self.split_sampler
        return self.sampler

    @torch.no_grad()
    def rollout(
        self, velocity: VelocityFn, initial: torch.Tensor, noise: NoiseFn, max_batch: int = 0
    ) -> TreeRollout:
        """Grow ``R`` trees from ``initial [R, *event]`` (one initial state per tree).

        ``velocity`` is called once per chunk of at most ``max_batch`` nodes (0: all nodes of a
        step at once) with the nodes' trees, so that it can pick their prompts' conditions.
        ``noise(step, n, event_shape)`` gives the step's ``n`` standard-normal draws, one per
        edge, so that callers control reproducibility.
        """
        schedule, num_trees = self.schedule, initial.shape[0]
        event = tuple(initial.shape[1:])
        states, next_states, parents, log_probs = [], [], [], []
        x = initial.float()
        for t in range(schedule.num_steps):
            width = schedule.width(t)
            trees = torch.arange(num_trees, device=x.device).repeat_interleave(width)
            size = max_batch or x.shape[0]
            v = torch.cat(
                [velocity(x[i : i + size], t, trees[i : i + size]) for i in range(0, len(x), size)]
            )
            parent = schedule.parents(t, num_trees).to(x.device)
            draws = noise(t, len(parent), event).to(x.device)
            out = self.sampler_for(t).step(v[parent], t, x[parent], noise=draws)  # type: ignore[attr-defined]
            states.append(x)
            next_states.append(out.prev_sample)
            parents.append(parent)
            log_probs.append(out.log_prob.float())
            x = out.prev_sample
        steps = range(schedule.num_steps)
        return TreeRollout(
            states=states,
            next_states=next_states,
            parents=parents,
            log_probs=log_probs,
            trainable=torch.tensor([t not in schedule.ode_steps for t in steps]),
            split=torch.tensor([t in schedule.split_steps for t in steps]),
        )


__all__ = ["TreeRollout", "TreeSampler", "TreeSchedule"]
