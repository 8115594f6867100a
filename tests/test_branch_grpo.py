"""BranchGRPO on the tiny digits task: training steps, pruning and the unit bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny import tiny_config

from genrl import Trainer
from genrl.config.errors import ConfigError
from genrl.objectives.tree_advantages import (
    depthwise_advantages,
    edge_advantages_per_leaf,
    node_values,
)
from genrl.objectives.tree_pruning import kept_edges, num_kept_edges, pruned_depths
from samplers.tree import TreeSchedule

TREE = ("algorithm.name=branch_grpo", "algorithm.split_steps=[0, 1]", "algorithm.branching=[2, 2]")
TREE += ("algorithm.clip_range=2e-3",)


@pytest.mark.parametrize(
    "variant",
    [
        (),
        (
            "algorithm.split_noise_level=1.2",
            "algorithm.fusion=probability",
            "algorithm.kl_beta=0.01",
        ),
        ("algorithm.split_noise_scale=4", "algorithm.split_log_prob=drawn"),
        ("algorithm.width_pruning=sibling_top", "algorithm.train_steps=[0, 1, 2]"),
        ("algorithm.width_pruning=last_split_top", "algorithm.fusion=path_probability"),
        ("algorithm.width_pruning=last_split_best_worst",),
        ("algorithm.ode_steps=[3]",),
    ],
    ids=[
        "plain",
        "split_level_probability_kl",
        "split_scale_drawn",
        "pruned",
        "reference_mode_1",
        "reference_mode_2",
        "mix",
    ],
)
def test_two_branch_grpo_steps_train(tmp_path: Path, variant: tuple[str, ...]) -> None:
    trainer = Trainer(tiny_config(tmp_path, *TREE, *variant), run_dir=tmp_path / "run")
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    # The planned count (schedule, depth and width pruning) is what training units hold.
    assert len(units) == trainer.objective.num_units(len(batch.rollout))
    first = trainer.train_iteration()
    assert first["loss/first_minibatch_ratio_deviation"] == 0.0
    trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    assert sum(not torch.equal(p, after[n]) for n, p in before.items()) >= 0.9 * len(before)


def test_units_by_hand(tmp_path: Path) -> None:
    """4 trees x 4 leaves, splits at steps 0 and 1 of 4: edges per tree 2 + 4 + 4 + 4."""
    trainer = Trainer(tiny_config(tmp_path, *TREE), run_dir=tmp_path / "a")
    assert trainer.objective.num_units(16) == 4 * 14
    pruned = tiny_config(tmp_path, *TREE, "algorithm.width_pruning=sibling_top",
                         "algorithm.train_steps=[1, 3]", "algorithm.ode_steps=[3]")  # fmt: skip
    objective = Trainer(pruned, run_dir=tmp_path / "b").objective
    # Step 1 splits (keep 1 of each 2 siblings: 2 of 4 edges); step 3 is an ODE step.
    assert objective.num_units(16) == 4 * 2


def test_sibling_top_keeps_the_largest_advantages_among_siblings() -> None:
    schedule = TreeSchedule(4, (0, 1), (2, 2))
    advantage = {t: torch.zeros(1, schedule.edges(t)) for t in range(4)}
    advantage[1] = torch.tensor([[0.5, -2.0, 1.0, 0.1]])  # siblings (0, 1) and (2, 3)
    kept = kept_edges(schedule, [1, 2], advantage, "sibling_top", 0.5)
    assert kept[1].tolist() == [1, 2]  # the larger |A| of each pair
    assert kept[2].tolist() == [0, 1, 2, 3]  # step 2 does not split: untouched


def test_reference_width_pruning_modes_by_hand() -> None:
    """The reference's modes act on the transitions after the last split (steps 2 and 3 of a
    tree that splits at 0 and 1 into 4 chains): mode 1 keeps each chain's top
    ``max(1, int(2 * 0.5)) = 1`` step by signed advantage (the earlier one on ties), mode 2
    the best ``k // 2`` and the worst ``k - k // 2`` of all, ``k = max(2, int(8 * 0.5)) = 4``."""
    schedule = TreeSchedule(4, (0, 1), (2, 2))
    advantage = {
        0: torch.tensor([[0.3, -0.3]]),
        1: torch.tensor([[1.0, -1.0, 0.2, -0.2]]),
        2: torch.tensor([[1.0, -1.0, 0.2, -0.2]]),
        3: torch.tensor([[1.5, -1.5, 0.2, -0.1]]),
    }
    steps = [0, 1, 2, 3]
    top = kept_edges(schedule, steps, advantage, "last_split_top", 0.5)
    assert top[0].tolist() == [0, 1] and top[1].tolist() == [0, 1, 2, 3]  # before: untouched
    # Chain 0: 1.0 (step 2) < 1.5 (step 3) -> step 3; chain 1: -1.0 > -1.5 -> step 2;
    # chain 2: a tie (0.2, 0.2) -> step 2; chain 3: -0.2 < -0.1 -> step 3.
    assert top[2].tolist() == [1, 2] and top[3].tolist() == [0, 3]
    extremes = kept_edges(schedule, steps, advantage, "last_split_best_worst", 0.5)
    # Best two: 1.5 (chain 0, step 3), 1.0 (chain 0, step 2); worst two: -1.5, -1.0 (chain 1).
    assert extremes[2].tolist() == [0, 1] and extremes[3].tolist() == [0, 1]
    for mode in ("last_split_top", "last_split_best_worst", "sibling_top", "best_worst_paths"):
        count = sum(len(v) for v in kept_edges(schedule, steps, advantage, mode, 0.5).values())
        assert count == num_kept_edges(schedule, steps, 1, mode, 0.5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("algorithm.branching=[2, 3]",), "must equal the tree's leaves"),
        (("algorithm.split_steps=[0, 9]",), "strictly increasing"),
        (("algorithm.train_steps=[3]", "algorithm.ode_steps=[3]"), "no step left to train"),
        (("algorithm.ode_steps=[1]",), "cannot be an ODE step"),
        (("train.dynamic_sampling=true",), "dynamic_sampling is not supported"),
    ],
)
def test_bad_tree_settings_are_refused(
    tmp_path: Path, overrides: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, *TREE, *overrides).validate()


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
def test_branch_grpo_on_the_tiny_sd3_pipeline(tmp_path: Path) -> None:
    """The diffusers adapter through the same code path: CFG in the tree rollout and in
    training, two steps change the LoRA weights, first-minibatch ratio exactly 1."""
    from accelerate.state import AcceleratorState
    from diffusers_tiny import tiny_sd3_run

    config = tiny_sd3_run(
        tmp_path,
        f"output_dir={tmp_path / 'run'}",
        "sampler.num_steps=4",
        "train.prompts_per_iteration=2",
        "train.group_size=4",
        "train.minibatch_size=16",
        *TREE,
        "algorithm.split_noise_level=0.9",
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        trainer = Trainer(config)
        before = {
            n: p.detach().clone()
            for n, p in trainer.policy.network.named_parameters()
            if p.requires_grad
        }
        first = trainer.train_iteration()
        trainer.train_iteration()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert first["loss/first_minibatch_ratio_deviation"] == 0.0
    after = dict(trainer.policy.network.named_parameters())
    assert sum(not torch.equal(p, after[n]) for n, p in before.items()) >= 0.9 * len(before)


def test_best_worst_pruning_trains_the_extreme_paths(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, *TREE, "algorithm.width_pruning=best_worst_paths")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    assert len(units) == trainer.objective.num_units(16) == 4 * 4 * 2  # 4 trees, 4 steps, 2 paths
    tree = batch.rollout.tree
    leaf = batch.rollout.advantages[:, -1].view(4, 4)  # the leaves' own edges
    best = int(leaf[0].argmax())
    # Tree 0's best path at the last step is its best leaf's own edge.
    last = units.timestep_index == 3
    assert torch.equal(units.next_sample[last][0], tree.next_states[3][best])
    first = trainer.train_iteration()
    assert first["loss/first_minibatch_ratio_deviation"] == 0.0


def test_a_tree_without_splits_is_the_flow_grpo_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Branching factor 1 everywhere (a group of one) samples exactly what Flow-GRPO samples
    with the same noise: same initial state, same step noise, same log-probs."""
    from genrl.algorithms import ALGORITHMS

    # Groups of one cannot train (zero advantages), but they sample: allow them for the rollouts.
    for name in ("flow_grpo", "branch_grpo"):
        monkeypatch.setattr(ALGORITHMS[name], "needs_groups", False)
    chain = (
        "train.group_size=1",
        "train.prompts_per_iteration=6",
        "sampler.same_initial_noise=true",
    )
    flow = Trainer(tiny_config(tmp_path, *chain), run_dir=tmp_path / "flow").collect()
    tree_config = tiny_config(
        tmp_path, *chain, "algorithm.name=branch_grpo", "algorithm.split_steps=[]",
        "algorithm.branching=[]",
    )  # fmt: skip
    tree = Trainer(tree_config, run_dir=tmp_path / "tree").collect().rollout.tree
    torch.testing.assert_close(tree.leaves, flow.rollout.final, rtol=0, atol=1e-6)
    for t in range(4):
        torch.testing.assert_close(
            tree.log_probs[t], flow.rollout.log_probs[:, t], rtol=0, atol=1e-6
        )


def test_a_tree_grows_the_same_on_any_process_layout(tmp_path: Path) -> None:
    """Tree 3 of 4 collected with all four trees (one process) or as part of the second half
    (the second of two processes): same leaves and log-probs."""
    from genrl.data.rng import RolloutNoise
    from genrl.loop.groups import expand_groups

    trainer = Trainer(tiny_config(tmp_path, *TREE), run_dir=tmp_path / "run")
    prompts, group_ids = expand_groups(trainer.prompts.sample(4, 0, 0), 4)

    def collect(local: slice):  # type: ignore[no-untyped-def]
        noise = RolloutNoise(0, 0, 16, local)
        return trainer.rollout.collect(trainer.policy, prompts[local], group_ids[local], noise)

    whole, half = collect(slice(0, 16)), collect(slice(8, 16))
    # Equal up to float rounding of different batch sizes (a different noise would differ by O(1)).
    torch.testing.assert_close(half.leaves[4:8], whole.leaves[12:16], rtol=0, atol=1e-5)
    # Step 1 has 4 edges per tree: tree 3's are edges 12-15 of all, 4-7 of the second half.
    torch.testing.assert_close(
        half.tree.log_probs[1][4:8], whole.tree.log_probs[1][12:16], rtol=0, atol=1e-5
    )


def test_sliding_depth_pruning_window_by_hand(tmp_path: Path) -> None:
    """Depths as the reference counts them (the edges of step t enter depth t + 1): prune depth
    4, slide one depth shallower every iteration, never shallower than depth 2."""
    from genrl.data.rng import RolloutNoise

    config = tiny_config(
        tmp_path, *TREE, "algorithm.depth_pruning=[4]", "algorithm.depth_pruning_slide_every=1",
        "algorithm.depth_pruning_stop=2",
    )  # fmt: skip
    assert [pruned_depths([4], 1, 2, i) for i in range(4)] == [[4], [3], [2], [2]]
    c = config.algorithm
    assert c.trained_steps(4, c.split_steps, c.ode_steps, iteration=1) == [0, 1, 3]
    trainer = Trainer(config, run_dir=tmp_path / "run")
    batch = trainer.collect()
    for iteration, expected in ((0, {0, 1, 2}), (2, {0, 2, 3})):
        noise = RolloutNoise(0, iteration, 16, slice(0, 16))
        units = trainer.objective.units(trainer.policy, batch.rollout, noise)
        assert set(units.timestep_index.tolist()) == expected
    # Without sliding the window stays; by default it stops at the last split step's depth.
    static = tiny_config(tmp_path, *TREE, "algorithm.depth_pruning=[3, 4]").algorithm
    assert static.trained_steps(4, static.split_steps, [], iteration=50) == [0, 1]
    slid = tiny_config(
        tmp_path, *TREE, "algorithm.depth_pruning=[3, 4]", "algorithm.depth_pruning_slide_every=1"
    )
    c = slid.algorithm
    assert c.trained_steps(4, c.split_steps, [], iteration=50) == [2, 3]  # depths 1, 2 pruned
    # The reference's --pruning_step_ratio: prune during the first half of 4 iterations only.
    late = tiny_config(
        tmp_path, *TREE, "algorithm.depth_pruning=[4]", "algorithm.pruning_fraction=0.5"
    )
    c = late.algorithm
    assert c.trained_steps(4, c.split_steps, [], iteration=2, iterations=4) == [0, 1, 2]
    assert c.trained_steps(4, c.split_steps, [], iteration=3, iterations=4) == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="child depths"):
        tiny_config(tmp_path, *TREE, "algorithm.depth_pruning=[0]").validate()


def test_noise_at_float_level_gives_zero_advantages(tmp_path: Path) -> None:
    """Issue 13's example: leaf rewards equal up to 1.2e-7 train on advantages of exactly 0
    (the reference's depth std threshold), not on O(1) advantages of normalised noise."""
    trainer = Trainer(tiny_config(tmp_path, *TREE), run_dir=tmp_path / "run")
    tree = torch.tensor([0.5, 0.5 + 1.2e-7, 0.5 - 0.6e-7, 0.5 + 0.6e-7])
    rewards = torch.cat([tree, torch.tensor([0.1, 0.9, 0.4, 0.6])])
    advantages = trainer.objective.advantages(rewards, [""] * 8, torch.tensor([0] * 4 + [1] * 4))
    assert advantages.shape == (8, 4)
    assert float(advantages[:4].abs().max()) == 0.0
    # The second tree: step 0's two edges own leaves (0.1, 0.9) and (0.4, 0.6): equal means,
    # advantage 0; the last step's edges are the leaves, z-scored with the sample std.
    assert advantages[4:, 0].tolist() == [0.0] * 4
    leaves = torch.tensor([0.1, 0.9, 0.4, 0.6])
    expected = (leaves - 0.5) / (leaves.std() + 1e-8)
    torch.testing.assert_close(advantages[4:, 3], expected)


def test_probability_fusion_reads_the_trees_edge_log_probs(tmp_path: Path) -> None:
    """The trainer gathers each leaf's path log-probs; the algorithm rebuilds the edges' own
    log-probs from them and fuses like ``node_values`` on the tree's log-probs directly."""
    config = tiny_config(tmp_path, *TREE, "algorithm.fusion=probability")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    batch = trainer.collect()
    tree, schedule = batch.rollout.tree, trainer.rollout.schedule
    factors = [schedule.factor(t) for t in range(4)]
    log_probs = [lp.view(4, -1) for lp in tree.log_probs]
    rewards = batch.scores[trainer.reward.name]
    values = node_values(rewards.view(4, 4), factors, "probability", log_probs)
    depth = depthwise_advantages(values)
    expected = edge_advantages_per_leaf(depth).clamp(-5, 5)
    torch.testing.assert_close(batch.rollout.advantages, expected)
