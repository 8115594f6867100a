"""BranchGRPO on the tiny digits task: training steps, pruning and the unit bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny import tiny_config

from genrl import Trainer
from genrl.overrides import ConfigError

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
        ("algorithm.width_pruning=sibling_top", "algorithm.train_steps=[0, 1, 2]"),
        ("algorithm.ode_steps=[3]",),
    ],
    ids=["plain", "split_noise_probability_kl", "pruned", "mix"],
)
def test_two_branch_grpo_steps_train(tmp_path: Path, variant: tuple[str, ...]) -> None:
    trainer = Trainer(tiny_config(tmp_path, *TREE, *variant), run_dir=tmp_path / "run")
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    batch = trainer.collect()
    units = trainer.algorithm.training_units(batch.rollout, batch.noise)
    # The planned count (schedule, depth and width pruning) is what training units hold.
    assert len(units) == trainer.algorithm.num_units(len(batch.rollout))
    first = trainer.train_iteration()
    assert first["loss/first_minibatch_ratio_deviation"] == 0.0
    trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    assert sum(not torch.equal(p, after[n]) for n, p in before.items()) >= 0.9 * len(before)


def test_units_by_hand(tmp_path: Path) -> None:
    """4 trees x 4 leaves, splits at steps 0 and 1 of 4: edges per tree 2 + 4 + 4 + 4."""
    trainer = Trainer(tiny_config(tmp_path, *TREE), run_dir=tmp_path / "a")
    assert trainer.algorithm.num_units(16) == 4 * 14
    pruned = tiny_config(tmp_path, *TREE, "algorithm.width_pruning=sibling_top",
                         "algorithm.train_steps=[1, 3]", "algorithm.ode_steps=[3]")  # fmt: skip
    algorithm = Trainer(pruned, run_dir=tmp_path / "b").algorithm
    # Step 1 splits (keep 1 of each 2 siblings: 2 of 4 edges); step 3 is an ODE step.
    assert algorithm.num_units(16) == 4 * 2


def test_pruning_keeps_the_largest_advantages_among_siblings(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, *TREE, "algorithm.width_pruning=sibling_top")
    algorithm = Trainer(config, run_dir=tmp_path / "run").algorithm
    advantage = torch.tensor([[0.5, -2.0, 1.0, 0.1]])  # siblings (0, 1) and (2, 3)
    assert algorithm._keep_mask(advantage, factor=2).tolist() == [[False, True, True, False]]
    assert algorithm._keep_mask(advantage, factor=1).all()


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
    config = tiny_config(tmp_path, *TREE, "algorithm.width_pruning=best_worst")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    batch = trainer.collect()
    units = trainer.algorithm.training_units(batch.rollout, batch.noise)
    assert len(units) == trainer.algorithm.num_units(16) == 4 * 4 * 2  # 4 trees, 4 steps, 2 paths
    tree = batch.rollout.tree
    leaf = batch.rollout.advantages.view(4, 4)
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
    from genrl.algorithms.base import RolloutNoise
    from genrl.groups import expand_groups

    trainer = Trainer(tiny_config(tmp_path, *TREE), run_dir=tmp_path / "run")
    prompts, group_ids = expand_groups(trainer.prompts.sample(4, 0, 0), 4)

    def collect(local: slice):  # type: ignore[no-untyped-def]
        noise = RolloutNoise(0, 0, 16, local)
        return trainer.algorithm.collect(trainer.policy, prompts[local], group_ids[local], noise)

    whole, half = collect(slice(0, 16)), collect(slice(8, 16))
    # Equal up to float rounding of different batch sizes (a different noise would differ by O(1)).
    torch.testing.assert_close(half.leaves[4:8], whole.leaves[12:16], rtol=0, atol=1e-5)
    # Step 1 has 4 edges per tree: tree 3's are edges 12-15 of all, 4-7 of the second half.
    torch.testing.assert_close(
        half.tree.log_probs[1][4:8], whole.tree.log_probs[1][12:16], rtol=0, atol=1e-5
    )


def test_sliding_depth_pruning_window_by_hand(tmp_path: Path) -> None:
    """Prune step 3, slide one step earlier every iteration, never before step 1."""
    from genrl.algorithms.base import RolloutNoise

    config = tiny_config(
        tmp_path, *TREE, "algorithm.depth_pruning=[3]", "algorithm.depth_pruning_slide_every=1",
        "algorithm.depth_pruning_stop=1",
    )  # fmt: skip
    algorithm = config.algorithm
    assert [algorithm.pruned_depths(i) for i in range(4)] == [[3], [2], [1], [1]]
    assert algorithm.trained_steps(4, iteration=1) == [0, 1, 3]
    trainer = Trainer(config, run_dir=tmp_path / "run")
    batch = trainer.collect()
    for iteration, expected in ((0, {0, 1, 2}), (2, {0, 2, 3})):
        noise = RolloutNoise(0, iteration, 16, slice(0, 16))
        units = trainer.algorithm.training_units(batch.rollout, noise)
        assert set(units.timestep_index.tolist()) == expected
    # Without sliding the window stays; the default stop is the last split step.
    static = tiny_config(tmp_path, *TREE, "algorithm.depth_pruning=[2, 3]").algorithm
    assert static.pruned_depths(50) == [2, 3]
    slid = tiny_config(
        tmp_path, *TREE, "algorithm.depth_pruning=[2, 3]", "algorithm.depth_pruning_slide_every=1"
    )
    assert slid.algorithm.pruned_depths(50) == [1, 2]  # the last split step is 1
