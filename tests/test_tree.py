"""BranchGRPO's tree sampler and its reward fusion / depth-wise advantages."""

from __future__ import annotations

import math

import pytest
import torch

from genrl.objectives.tree_advantages import (
    depthwise_advantages,
    edge_advantages_per_leaf,
    node_values,
)
from samplers import FlowODESampler, FlowSDESampler, flow_sigmas
from samplers.tree import TreeSampler, TreeSchedule


def test_schedule_counts_by_hand() -> None:
    schedule = TreeSchedule(num_steps=4, split_steps=(0, 2), branching=(2, 3))
    assert [schedule.width(t) for t in range(5)] == [1, 2, 2, 6, 6]
    assert [schedule.edges(t) for t in range(4)] == [2, 2, 6, 6]
    assert schedule.num_leaves == 6 and schedule.edges_per_tree == 16
    assert schedule.parents(2, num_trees=2).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert schedule.parents(1, num_trees=2).tolist() == [0, 1, 2, 3]
    deep = TreeSchedule(num_steps=10, split_steps=(1, 3, 5, 7), branching=(2, 2, 2, 2))
    # Step 0 has one edge, then 2, 2, 4, 4, 8, 8 and 16 for the last three steps.
    assert deep.num_leaves == 16 and deep.edges_per_tree == 1 + 2 * 2 + 4 * 2 + 8 * 2 + 16 * 3
    chain = TreeSchedule(num_steps=5, split_steps=(), branching=())
    assert chain.num_leaves == 1 and chain.edges_per_tree == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split_steps": (2, 1), "branching": (2, 2)}, "strictly increasing"),
        ({"split_steps": (4,), "branching": (2,)}, "strictly increasing"),
        ({"split_steps": (1,), "branching": (2, 2)}, "one branching factor per split"),
        ({"split_steps": (1,), "branching": (0,)}, ">= 1"),
        ({"split_steps": (1,), "branching": (2,), "ode_steps": (1,)}, "cannot be an ODE step"),
    ],
)
def test_bad_schedules_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TreeSchedule(num_steps=4, **kwargs)


def velocity(x: torch.Tensor, step: int, trees: torch.Tensor) -> torch.Tensor:
    """A toy velocity that depends on the state, the step and the tree (the prompt)."""
    return -x * (step + 1) / 5 + trees.float().view(-1, *[1] * (x.ndim - 1)) * 0.1


def seeded_noise(seed: int):  # type: ignore[no-untyped-def]
    def noise(step: int, n: int, event: tuple[int, ...]) -> torch.Tensor:
        return torch.randn((n, *event), generator=torch.Generator().manual_seed(seed * 1000 + step))

    return noise


def make_sampler(schedule: TreeSchedule, split_noise: float = 0.7) -> TreeSampler:
    sigmas = flow_sigmas(schedule.num_steps)
    return TreeSampler(
        schedule,
        FlowSDESampler(sigmas, noise_level=0.7),
        split_sampler=FlowSDESampler(sigmas, noise_level=split_noise),
        ode_sampler=FlowODESampler(sigmas),
    )


def test_rollout_shapes_forwards_and_rescoring_every_edge() -> None:
    schedule = TreeSchedule(num_steps=5, split_steps=(0, 2), branching=(2, 3), ode_steps=(4,))
    tree = make_sampler(schedule, split_noise=1.2)
    initial = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    out = tree.rollout(velocity, initial, seeded_noise(1))
    assert out.leaves.shape == (3 * 6, 2, 4, 4)
    assert out.forwards == 3 * (1 + 2 + 2 + 6 + 6)  # nodes per step, all trees
    assert out.trainable.tolist() == [True, True, True, True, False]
    assert out.split.tolist() == [True, False, True, False, False]
    for t in range(5):
        parent_states = out.states[t][out.parents[t]]
        trees = torch.arange(3).repeat_interleave(schedule.width(t))[out.parents[t]]
        v = velocity(parent_states, t, trees)
        again = tree.sampler_for(t).step(v, t, parent_states, prev_sample=out.next_states[t])
        assert torch.equal(again.log_prob, out.log_probs[t])  # bit for bit
        if t in schedule.split_steps:  # the split edges' density is the split sampler's
            base = tree.sampler.step(v, t, parent_states, prev_sample=out.next_states[t])
            assert not torch.allclose(base.log_prob, out.log_probs[t])
    assert torch.equal(out.log_probs[4], torch.zeros(18))  # the ODE step has no density
    # Siblings share the prefix: the 3 children of a node at step 2 start from one state.
    assert torch.equal(out.states[2][out.parents[2][:3]], out.states[2][[0, 0, 0]])


def test_chunked_forwards_equal_one_batch() -> None:
    schedule = TreeSchedule(num_steps=4, split_steps=(1, 2), branching=(2, 2))
    tree = make_sampler(schedule)
    initial = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    whole = tree.rollout(velocity, initial, seeded_noise(3))
    chunked = tree.rollout(velocity, initial, seeded_noise(3), max_batch=3)
    assert torch.equal(whole.leaves, chunked.leaves)


def test_branching_factor_one_is_a_flow_grpo_rollout() -> None:
    """Without splits the tree is one SDE trajectory per tree, as Flow-GRPO samples it."""
    schedule = TreeSchedule(num_steps=6, split_steps=(2,), branching=(1,))
    tree = make_sampler(schedule, split_noise=0.7)
    initial = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    out = tree.rollout(velocity, initial, seeded_noise(5))
    sampler, x = FlowSDESampler(flow_sigmas(6), noise_level=0.7), initial
    trees = torch.arange(4)
    for t in range(6):
        step = sampler.step(velocity(x, t, trees), t, x, noise=seeded_noise(5)(t, 4, (1, 8, 8)))
        torch.testing.assert_close(step.log_prob, out.log_probs[t], rtol=0, atol=0)
        x = step.prev_sample
    assert torch.equal(x, out.leaves)


def test_fusion_and_depthwise_advantages_by_hand() -> None:
    """The reference's conventions (BranchGRPO's ``train_branchgrpo_flux.py``,
    ``compute_hierarchical_advantages_by_depth``): raw leaf rewards, node = mean of its leaves,
    per depth ``(v - mean) / (torch.std(v) + 1e-8)`` with the sample (Bessel) std."""
    # One tree: step 0 does not split, steps 1 and 2 split in two: 1, 2, 4 nodes below the root.
    leaves = torch.tensor([[1.0, 3.0, 2.0, 6.0]])
    values = node_values(leaves, [1, 2, 2])
    assert [v.tolist() for v in values] == [[[3.0]], [[3.0]], [[2.0, 4.0]], [[1.0, 3.0, 2.0, 6.0]]]
    advantages = depthwise_advantages(values)
    assert advantages[0].tolist() == advantages[1].tolist() == [[0.0]]  # one node per depth
    # [2, 4]: mean 3, sample std sqrt(2).
    torch.testing.assert_close(advantages[2][0], torch.tensor([-1.0, 1.0]) / math.sqrt(2))
    # [1, 3, 2, 6]: mean 3, sample variance (4 + 0 + 1 + 9) / 3 = 14 / 3.
    expected = (torch.tensor([1.0, 3.0, 2.0, 6.0]) - 3) / math.sqrt(14 / 3)
    torch.testing.assert_close(advantages[3][0], expected)
    population = depthwise_advantages(values, std_estimator="population", eps=0.0)
    torch.testing.assert_close(
        population[3][0], (torch.tensor([1.0, 3, 2, 6]) - 3) / math.sqrt(3.5)
    )
    # Per leaf and step: the advantage of the edge of step t on the leaf's path (depth t + 1).
    per_leaf = edge_advantages_per_leaf(advantages)
    assert per_leaf.shape == (4, 3)
    torch.testing.assert_close(per_leaf[:, 1], advantages[2][0].repeat_interleave(2))
    torch.testing.assert_close(per_leaf[:, 2], advantages[3][0])
    assert per_leaf[:, 0].tolist() == [0.0] * 4


def test_rewards_equal_up_to_float_noise_give_zero_advantages() -> None:
    """Issue 13: the earlier genrl z-scored already normalised leaf advantages, so reward noise
    of 1e-7 became advantages of about +-0.75 and [-0.39, 1.17, -1.17, 0.39]; the reference
    (std below 1e-6 -> 0) gives exactly 0, flat GRPO at most 1.2e-3."""
    leaves = torch.tensor([[0.5, 0.5 + 1.2e-7, 0.5 - 0.6e-7, 0.5 + 0.6e-7]])
    advantages = depthwise_advantages(node_values(leaves, [2, 2]))
    assert all(float(a.abs().max()) == 0.0 for a in advantages)
    # With a real spread the depths are normalised: an affine map (a > 0) changes nothing.
    spread = torch.tensor([[0.1, 0.9, 0.4, 0.6]])
    a = depthwise_advantages(node_values(spread, [2, 2]))
    b = depthwise_advantages(node_values(3.0 * spread - 7.0, [2, 2]))
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_probability_weighted_fusion_by_hand_and_stable() -> None:
    leaves = torch.tensor([[1.0, 3.0, 2.0, 6.0]])
    log_probs = [
        torch.tensor([[0.0]]),
        torch.tensor([[0.0, math.log(2.0)]]),
        torch.tensor([[0.0, math.log(3.0), 0.0, 0.0]]),
    ]
    # The reference: at each split node a softmax over its children's own edge log-probs.
    values = node_values(leaves, [1, 2, 2], "probability", log_probs)
    # Depth 2: children (1, 3) weighted 1 : 3 -> 2.5; (2, 6) weighted 1 : 1 -> 4.
    assert values[2].tolist() == [[pytest.approx(2.5), pytest.approx(4.0)]]
    # Depth 1: children (2.5, 4) weighted 1 : 2 -> 3.5; the root has one child and passes it up.
    assert float(values[1]) == pytest.approx(3.5)
    assert float(values[0]) == pytest.approx(3.5)
    # The earlier variant: leaves weighted by their whole path below the node (1 : 3 : 2 : 2).
    path = node_values(leaves, [1, 2, 2], "path_probability", log_probs)
    assert path[2].tolist() == [[pytest.approx(2.5), pytest.approx(4.0)]]
    assert float(path[1]) == pytest.approx((1 + 9 + 4 + 12) / 8)
    for fusion in ("probability", "path_probability"):
        shifted = node_values(leaves, [1, 2, 2], fusion, [lp.double() - 5000.0 for lp in log_probs])
        again = node_values(leaves, [1, 2, 2], fusion, log_probs)
        assert float(shifted[1]) == pytest.approx(float(again[1]))  # no underflow
    with pytest.raises(ValueError, match="leaves per tree"):
        node_values(leaves, [3])
    with pytest.raises(ValueError, match="needs one edge log-prob"):
        node_values(leaves, [1, 2, 2], "probability")
