"""The ``compositional_<algorithm>`` recipes of issue 16: one sample budget and the shared
policy, rewards and evaluation of ``compositional_flow_grpo``, each method's own settings, and
one training iteration of each on the shipped 1.1M-parameter generator."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from genrl import Trainer, get_recipe
from genrl.recipes import RECIPES
from genrl.recipes.compositional_methods import (
    COMPOSITIONAL_METHOD_RECIPES,
    LR_FACTORS,
    TUNING_KNOBS,
)

BASE = "compositional_flow_grpo"


def test_every_method_has_a_registered_recipe() -> None:
    methods = {
        "flow_grpo_fast", "mix_grpo", "cps", "dance_grpo", "branch_grpo", "ram", "gdro",
        "gdro_offline", "diffusion_nft", "dgpo", "awm",
    }  # fmt: skip
    assert set(COMPOSITIONAL_METHOD_RECIPES) == {f"compositional_{m}" for m in methods}
    assert all(RECIPES[name] is fn for name, fn in COMPOSITIONAL_METHOD_RECIPES.items())


@pytest.mark.parametrize("name", list(COMPOSITIONAL_METHOD_RECIPES))
def test_recipes_share_the_budget_policy_rewards_and_evaluation(name: str) -> None:
    base, config = get_recipe(BASE), get_recipe(name)
    config.validate()
    assert config.recipe == name
    assert config.policy == base.policy and config.prompts == base.prompts
    assert config.reward == base.reward and config.eval == base.eval
    assert config.optim == base.optim
    t, b = config.train, base.train
    # The same samples per iteration (16 x 8) and the same iterations: 25,600 samples.
    assert (t.iterations, t.prompts_per_iteration, t.group_size) == (200, 16, 8)
    assert (b.iterations, b.prompts_per_iteration, b.group_size) == (200, 16, 8)
    assert (config.sampler.num_steps, config.sampler.eval_num_steps) == (10, 10)
    if t.offline_store:  # the store holds the whole budget: one pass, no extra samples
        assert t.offline_groups * t.group_size == 200 * 16 * 8


def test_methods_keep_their_reference_settings() -> None:
    """The values each docstring says it takes from the digits recipes and tables."""
    fast = get_recipe("compositional_flow_grpo_fast").sampler
    assert (fast.name, fast.noise_level, fast.sde_window_size) == ("flow_cps", 0.8, 3)
    assert fast.sde_window_range == [0, 5] and fast.same_initial_noise
    mix = get_recipe("compositional_mix_grpo").sampler
    assert (mix.name, mix.sde_window_size, mix.sde_window_schedule) == (
        "flow_sde",
        4,
        "progressive",
    )
    assert (mix.sde_window_shift_every, mix.sde_window_wrap) == (25, True)
    cps = get_recipe("compositional_cps")
    assert (cps.sampler.name, cps.sampler.noise_level, cps.sampler.sde_window_size) == (
        "flow_cps", 0.8, 0,
    )  # fmt: skip
    assert cps.algorithm.timestep_fraction == 0.5
    dance = get_recipe("compositional_dance_grpo")
    assert (dance.sampler.name, dance.sampler.noise_level) == ("dance_sde", 0.3)
    assert (dance.algorithm.timestep_selection, dance.algorithm.timestep_fraction) == (
        "random", 0.6,
    )  # fmt: skip
    branch = get_recipe("compositional_branch_grpo").algorithm
    assert (branch.split_steps, branch.branching, branch.split_noise_scale) == (
        [0, 3, 6], [2, 2, 2], 1.3,
    )  # fmt: skip
    assert get_recipe("compositional_branch_grpo").train.group_size == 2 * 2 * 2
    ram = get_recipe("compositional_ram").algorithm
    assert (ram.reward_multiplier, ram.noisings_per_sample, ram.time_sampling) == (
        100.0, 8, "linear",
    )  # fmt: skip
    gdro = get_recipe("compositional_gdro")
    assert (gdro.algorithm.beta, gdro.algorithm.tau, gdro.algorithm.gamma) == (1.0, 0.05, 1.0)
    assert gdro.algorithm.noisings_per_sample == 8 and gdro.train.minibatch_size == 16
    offline = get_recipe("compositional_gdro_offline")
    assert offline.algorithm.beta == 2.0 and offline.train.offline_groups == 3200
    nft = get_recipe("compositional_diffusion_nft").algorithm
    assert (nft.beta, nft.noisings_per_sample, nft.sampling_ema_decay) == (1.0, 9, 0.5)
    dgpo = get_recipe("compositional_dgpo")
    d = dgpo.algorithm  # the released GenEval config but beta (docstring)
    assert (d.beta, d.kl_beta, d.clip_range, d.std_mode) == (10.0, 0.02, 0.01, "group")
    assert (d.noisings_per_sample, d.sampler_levels, d.share_noise) == (4, 5, True)
    assert (d.sampling_ema_decay, d.sampling_ema_ramp) == (0.3, 0.001)
    assert dgpo.train.minibatch_size == 16
    awm = get_recipe("compositional_awm").algorithm
    assert (awm.weighting, awm.ghuber_power, awm.beta, awm.lagged_beta) == (
        "ghuber", 0.25, 0.001, 1.0,
    )  # fmt: skip
    assert (awm.noisings_per_sample, awm.advantage_clip, awm.advantage_max) == (6, 5.0, 1.0)


@pytest.mark.parametrize("name", sorted(TUNING_KNOBS))
def test_each_tuning_knob_is_a_field_of_its_recipe_and_holds_its_value(name: str) -> None:
    """The grid contains the recipe's own setting, and every value of it makes a valid config."""
    knob = TUNING_KNOBS[name]
    section, field = knob.field.split(".")
    assert getattr(getattr(get_recipe(name), section), field) in knob.values
    for value in knob.values:
        config = get_recipe(name)
        config.apply_overrides([f"{knob.field}={value}"])
        config.validate()


def test_every_benchmark_recipe_has_a_tuning_knob() -> None:
    assert set(TUNING_KNOBS) == {BASE, *COMPOSITIONAL_METHOD_RECIPES}
    assert LR_FACTORS == (0.5, 1.0, 2.0)


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
@pytest.mark.parametrize("name", ["compositional_dgpo", "compositional_awm"])
def test_dgpo_and_awm_train_two_iterations(tmp_path: Path, name: str) -> None:
    """Two iterations, so that the second trains against a lagged copy that has moved: DGPO's
    clip and AWM's lagged KL act from then on. Parameters change in each iteration."""
    torch.manual_seed(0)
    config = get_recipe(name)
    config.apply_overrides([
        "train.prompts_per_iteration=4", "train.iterations=2", "eval.every=0",
        "logging.tensorboard=false", "logging.progress_bar=false",
        'reward.0.kwargs={"partial_credit": true}',
    ] + (["train.minibatch_size=2"] if name == "compositional_dgpo" else []))  # fmt: skip
    trainer = Trainer(config, run_dir=tmp_path / "run")
    for iteration in range(2):
        before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
        metrics = trainer.train_iteration()
        after = dict(trainer.policy.network.named_parameters())
        moved = [n for n, p in before.items() if not torch.equal(p, after[n])]
        assert len(moved) >= 0.9 * len(before), (name, iteration)
        assert metrics["optimizer_steps"] >= 1 and math.isfinite(metrics["loss/total"])


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
@pytest.mark.parametrize("name", list(COMPOSITIONAL_METHOD_RECIPES))
def test_each_recipe_trains_the_shipped_policy(tmp_path: Path, name: str) -> None:
    """One iteration of 4 prompts x 8 on the real generator and scorer (partial credit, so
    that a group of a binary reward rarely scores all-equal and leaves nothing to train)."""
    torch.manual_seed(0)
    config = get_recipe(name)
    overrides = [
        "train.prompts_per_iteration=4",
        "eval.every=0",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
        'reward.0.kwargs={"partial_credit": true}',
    ]
    if config.train.offline_store:
        overrides += [f"train.offline_store={tmp_path / 'store'}", "train.offline_groups=4"]
    if config.train.minibatch_size == 16:  # GDRO: minibatches of groups
        overrides.append("train.minibatch_size=2")
    config.apply_overrides(overrides)
    trainer = Trainer(config, run_dir=tmp_path / "run")
    if config.train.offline_store:
        assert trainer.collector.fill_offline_store() == 4
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    metrics = trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    moved = [n for n, p in before.items() if not torch.equal(p, after[n])]
    assert len(moved) >= 0.9 * len(before), f"{name}: {sorted(set(before) - set(moved))}"
    assert metrics["optimizer_steps"] >= 1 and math.isfinite(metrics["loss/total"])
    assert 0.0 <= metrics["compositional/mean"] <= 1.0
