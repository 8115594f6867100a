"""RAM, GDRO, DiffusionNFT and DGPO through the trainer: units, the lagged copy, training steps on the
embedded task and on the tiny SD3 pipeline, and configuration errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tiny import tiny_config

from genrl import Trainer
from genrl.config.errors import ConfigError

ALGORITHMS = {
    "ram": ("algorithm.name=ram", "algorithm.noisings_per_sample=2"),
    "ram_eq17_control_weight": (
        "algorithm.name=ram",
        "algorithm.correction=current",
        "algorithm.time_weighting=control",
    ),
    "diffusion_nft": ("algorithm.name=diffusion_nft", "algorithm.noisings_per_sample=3"),
    "gdro": ("algorithm.name=gdro", "algorithm.noisings_per_sample=2", "train.minibatch_size=4"),
    "gdro_own_noise": ("algorithm.name=gdro", "algorithm.share_noise=false"),
    "dgpo": ("algorithm.name=dgpo", "algorithm.noisings_per_sample=2", "train.minibatch_size=4"),
    "dgpo_lagged_reference_own_noise": (
        "algorithm.name=dgpo",
        "algorithm.reference=lagged",
        "algorithm.clip_range=null",
        "algorithm.kl_beta=0",
        "algorithm.share_noise=false",
        "algorithm.time_sampling=uniform",
    ),
    "awm": ("algorithm.name=awm", "algorithm.noisings_per_sample=3"),
    "awm_t_weighted_logit_normal_no_kl": (
        "algorithm.name=awm",
        "algorithm.weighting=t",
        "algorithm.time_sampling=logit_normal",
        "algorithm.beta=0",
        "algorithm.lagged_beta=0",
    ),
}


def _trainable(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone()
        for n, p in trainer.policy.network.named_parameters()
        if p.requires_grad
    }


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_two_steps_train_on_the_embedded_task(tmp_path: Path, name: str) -> None:
    trainer = Trainer(tiny_config(tmp_path, *ALGORITHMS[name]), run_dir=tmp_path / "run")
    before = _trainable(trainer)
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    assert len(units) == trainer.objective.num_units(len(batch.rollout))
    metrics = trainer.train_iteration()
    trainer.train_iteration()
    after = _trainable(trainer)
    assert sum(not torch.equal(p, after[n]) for n, p in before.items()) >= 0.9 * len(before)
    assert torch.isfinite(torch.tensor(metrics["loss/total"]))


def test_units_share_time_and_noise_as_documented(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path, *ALGORITHMS["gdro"]), run_dir=tmp_path / "g")
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    # 4 groups of 4, 2 noisings each: 8 units of 4 members, one eps per unit
    assert units.clean.shape[:2] == (8, 4) and units.sigma.shape == (8,)
    assert torch.equal(units.noise[:, :1].expand_as(units.noise), units.noise)
    assert torch.equal(units.rows[0], torch.arange(4)) and torch.equal(
        units.rows[2], torch.arange(4, 8)
    )
    # members are their group's samples; advantages are rewards minus the group mean
    assert torch.equal(units.clean[0], batch.rollout.samples[:4])
    assert units.advantages[0].sum().abs() < 1e-5
    own = Trainer(tiny_config(tmp_path, *ALGORITHMS["gdro_own_noise"]), run_dir=tmp_path / "o")
    batch = own.collect()
    units = own.objective.units(own.policy, batch.rollout, batch.noise)
    assert not torch.equal(units.noise[0, 0], units.noise[0, 1])

    ram = Trainer(tiny_config(tmp_path, *ALGORITHMS["ram"]), run_dir=tmp_path / "r")
    batch = ram.collect()
    units = ram.objective.units(ram.policy, batch.rollout, batch.noise)
    assert units.clean.shape[:2] == (32, 1)  # 16 samples x 2 noisings
    assert torch.equal(units.clean[0, 0], units.clean[1, 0])  # the same sample's two noisings
    assert not torch.equal(units.noise[0], units.noise[1])
    noised = units.noised
    t = units.sigma.view(-1, *[1] * (units.clean.dim() - 1))
    assert torch.allclose(noised, (1 - t) * units.clean + t * units.noise)


def test_the_lagged_copy_follows_its_schedule(tmp_path: Path) -> None:
    """RAM's copy starts as the policy (decay 0 at iteration 0), then lags with decay
    ``min(0.01 k, 0.9)``; its state survives a checkpoint."""
    config = tiny_config(tmp_path, *ALGORITHMS["ram"], "algorithm.sampling_ema_ramp=0.25")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    rollout = trainer.rollout
    assert [config.algorithm.lagged_decay(k) for k in (0, 1, 2, 5)] == [0.0, 0.25, 0.5, 0.9]
    trainer.train_iteration()
    theta = _trainable(trainer)
    old = {n: t.clone() for n, t in rollout.lagged.shadow.items()}
    trainer.train_iteration()  # copy <- 0.25 old + 0.75 theta, before sampling
    for n, value in rollout.lagged.shadow.items():
        assert torch.allclose(value, 0.25 * old[n] + 0.75 * theta[n], atol=1e-6)
    state = rollout.state_dict()
    fresh = Trainer(config, run_dir=tmp_path / "other").rollout
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.lagged.shadow[n], v) for n, v in rollout.lagged.shadow.items())


def test_ram_correction_by_lagged_copy_equals_eq17_when_the_copy_is_current(
    tmp_path: Path,
) -> None:
    lagged = Trainer(tiny_config(tmp_path, *ALGORITHMS["ram"]), run_dir=tmp_path / "a")
    current = Trainer(
        tiny_config(tmp_path, *ALGORITHMS["ram"], "algorithm.correction=current"),
        run_dir=tmp_path / "b",
    )
    batch = lagged.collect()  # iteration 0: the copy equals the policy
    units = lagged.objective.units(lagged.policy, batch.rollout, batch.noise).select(slice(0, 8))
    a, _ = lagged.objective.loss(lagged.policy, units)
    b, _ = current.objective.loss(current.policy, units)
    assert torch.allclose(a, b, atol=1e-6)


def test_nft_first_minibatch_has_no_policy_gradient_at_half_optimality(tmp_path: Path) -> None:
    """The lagged copy equals the policy at iteration 0; with every r = 1/2 and no KL the
    minibatch gradient is zero (the paper's limiting case, on the real model)."""
    trainer = Trainer(
        tiny_config(tmp_path, *ALGORITHMS["diffusion_nft"], "algorithm.kl_beta=0"),
        run_dir=tmp_path / "run",
    )
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise).select(slice(0, 8))
    units.advantages = torch.zeros_like(units.advantages)
    loss, _ = trainer.objective.loss(trainer.policy, units)
    loss.backward()
    grads = [p.grad for p in trainer.policy.trainable_parameters() if p.grad is not None]
    assert grads and max(float(g.abs().max()) for g in grads) < 1e-6


def test_dgpo_starts_at_the_reference_on_the_noisiest_levels(tmp_path: Path) -> None:
    """At iteration 0 the policy is the frozen reference and the lagged copy: every group's
    margin is 0 (weight 1/2, DPO loss log 2), nothing is clipped, and ``t`` takes only the
    sampler's first ``sampler_levels`` levels."""
    config = tiny_config(tmp_path, *ALGORITHMS["dgpo"], "algorithm.sampler_levels=2")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    levels = trainer.rollout.ode.sigmas[:2].to(units.sigma.device)
    assert bool((units.sigma[:, None] == levels[None]).any(1).all())
    assert len(set(units.sigma.tolist())) == 2  # both levels drawn among 8 units
    _, metrics = trainer.objective.loss(trainer.policy, units.select(slice(0, 4)))
    assert metrics["group_weight_mean"].item() == pytest.approx(0.5, abs=1e-6)
    assert metrics["group_dpo_loss"].item() == pytest.approx(math.log(2), abs=1e-6)
    assert metrics["clip_fraction"].item() == 0.0


def test_awm_levels_are_stratified_and_the_current_weights_sample(tmp_path: Path) -> None:
    """With 4 steps and fraction 0.9 the released strata are ``linspace(1, 3, 4)`` truncated,
    ``1, 1, 2, 3``: the 3 noisings of every sample sit at levels 1, 1 and 2, each with its own
    ``eps``. At iteration 0 the policy, the frozen model and the lagged copy agree (both KLs
    0). The endpoints come from the current weights, whatever the lagged copy holds."""
    trainer = Trainer(tiny_config(tmp_path, *ALGORITHMS["awm"]), run_dir=tmp_path / "run")
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    sigmas = trainer.rollout.ode.sigmas.to(units.sigma.device)
    assert units.clean.shape[:2] == (48, 1)  # 16 samples x 3 noisings
    assert torch.equal(units.sigma.view(16, 3), sigmas[[1, 1, 2]].expand(16, 3))
    assert not torch.equal(units.noise[0], units.noise[1])
    assert units.advantages.abs().max() <= 1.0  # clipped to 5, scaled by 1 / 5
    _, metrics = trainer.objective.loss(trainer.policy, units.select(slice(0, 6)))
    assert metrics["kl"].item() == 0.0 and metrics["lagged_kl"].item() == 0.0
    rollout, r = trainer.rollout, batch.rollout
    for shadow in rollout.lagged.shadow.values():
        shadow.add_(1.0)
    again = rollout.collect(trainer.policy, r.prompts, r.group_ids, batch.noise)
    assert torch.equal(again.samples, r.samples)
    rollout.sample_with_lagged = True  # as RAM / DGPO / DiffusionNFT: now the copy samples
    moved = rollout.collect(trainer.policy, r.prompts, r.group_ids, batch.noise)
    assert not torch.equal(moved.samples, r.samples)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("algorithm.name=ram", "algorithm.reward_multiplier=0"), "reward_multiplier"),
        (("algorithm.name=ram", "algorithm.noisings_per_sample=0"), "noisings_per_sample"),
        (("algorithm.name=ram", "algorithm.time_min=0.9", "algorithm.time_max=0.5"), "time_min"),
        (("algorithm.name=gdro", "train.group_size=1"), "group_size must be >= 2"),
        (("algorithm.name=diffusion_nft", "algorithm.beta=0"), "beta must be positive"),
        (("algorithm.name=ram", "train.offline_store=store"), "cannot read an offline store"),
        (("algorithm.name=gdro", "train.offline_groups=4"), "needs train.offline_store"),
        (
            ("algorithm.name=gdro", "algorithm.sampling_ema_decay=0.5"),
            "unknown config key .algorithm.sampling_ema_decay.",
        ),
        (("algorithm.name=diffusion_nft", "sampler.guidance_scale=4.5"), "without CFG"),
        (("algorithm.name=dgpo", "train.group_size=1"), "group_size must be >= 2"),
        (("algorithm.name=dgpo", "algorithm.clip_range=0"), "clip_range must be positive"),
        (("algorithm.name=awm", "algorithm.ghuber_power=0"), "ghuber_power must be positive"),
        (("algorithm.name=awm", "algorithm.level_fraction=0"), "level_fraction"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, *overrides).validate()


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
@pytest.mark.parametrize("name", ["ram", "diffusion_nft", "gdro", "dgpo", "awm"])
def test_on_the_tiny_sd3_pipeline(tmp_path: Path, name: str) -> None:
    """The diffusers adapter through the same path: LoRA, CFG in sampling only, the reference
    through the disabled adapter; two steps change the LoRA weights."""
    from accelerate.state import AcceleratorState
    from diffusers_tiny import tiny_sd3_run

    config = tiny_sd3_run(
        tmp_path,
        f"output_dir={tmp_path / 'run'}",
        "sampler.num_steps=3",
        "train.prompts_per_iteration=2",
        "train.group_size=3",
        "train.minibatch_size=4",
        f"algorithm.name={name}",
        "algorithm.noisings_per_sample=2",
    )
    if name == "diffusion_nft":  # CFG-free by construction
        config.apply_overrides(["sampler.guidance_scale=1"])
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        trainer = Trainer(config)
        before = _trainable(trainer)
        trainer.train_iteration()
        metrics = trainer.train_iteration()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    after = _trainable(trainer)
    changed = sum(not torch.equal(p, after[n]) for n, p in before.items())
    # SD3's last block has an exactly-zero gradient on its text-query LoRA (see test_diffusers).
    assert changed >= 0.9 * len(before)
    assert torch.isfinite(torch.tensor(metrics["loss/total"]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe",
    [
        "digits_ram",
        "digits_gdro",
        "digits_gdro_offline",
        "digits_diffusion_nft",
        "digits_dgpo",
        "digits_awm",
    ],
)
def test_recipes_raise_the_heldout_reward_of_the_embedded_task(tmp_path: Path, recipe: str) -> None:
    """The shipped digits generator and classifier, 10 of the recipe's 60 iterations."""
    from genrl import get_recipe

    config = get_recipe(recipe)
    config.apply_overrides(
        [
            "train.iterations=10",
            "eval.samples_per_prompt=8",
            "eval.every=0",
            "logging.progress_bar=false",
            "logging.tensorboard=false",
            f"train.offline_store={tmp_path / 'store'}" if config.train.offline_store else "seed=0",
        ]
    )
    summary = Trainer(config, run_dir=tmp_path / "run").train()
    assert summary["heldout_reward_after"] > summary["heldout_reward_before"] + 0.2


def test_whole_groups_per_process_are_checked_before_training(tmp_path: Path) -> None:
    # 3 groups of 4: 12 samples split evenly over 2 processes, but a group would straddle them
    config = tiny_config(tmp_path, *ALGORITHMS["gdro"], "train.prompts_per_iteration=3")
    with pytest.raises(ConfigError, match="divisible by the number of processes"):
        config.validate(num_processes=2)
    config.validate(num_processes=3)


def test_the_lagged_copy_is_built_late_and_steps_once_per_iteration(tmp_path: Path) -> None:
    """Built at first use (after the trainer moved the network), stepped once per iteration
    even when an iteration is collected again (a refill round, a resumed iteration)."""
    config = tiny_config(tmp_path, *ALGORITHMS["ram"], "algorithm.sampling_ema_ramp=0.5")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    rollout = trainer.rollout
    assert rollout._lagged is None
    trainer.train_iteration()
    trainer.train_iteration()  # iteration 1: copy <- 0.5 old + 0.5 theta
    stepped = {n: t.clone() for n, t in rollout.lagged.shadow.items()}
    assert rollout.lagged_iteration == 1
    trainer.iteration = 1  # collect iteration 1 again
    trainer.collect()
    assert all(torch.equal(stepped[n], t) for n, t in rollout.lagged.shadow.items())
    state = rollout.state_dict()
    fresh = Trainer(config, run_dir=tmp_path / "other").rollout
    fresh.load_state_dict(state)
    assert fresh.lagged_iteration == 1
    assert all(torch.equal(fresh.lagged.shadow[n], t) for n, t in stepped.items())


def test_per_sample_noise_streams_do_not_depend_on_the_process_layout() -> None:
    from genrl.data.rng import RolloutNoise

    whole = RolloutNoise(3, 7, 6, slice(0, 6)).randn_by_sample("test_stream", (2, 3))
    halves = [
        RolloutNoise(3, 7, 6, s).randn_by_sample("test_stream", (2, 3))
        for s in (slice(0, 3), slice(3, 6))
    ]
    assert torch.equal(torch.cat(halves), whole)
    assert not torch.equal(whole[0], whole[1])


def test_corrected_score_is_logged_without_changing_the_training_reward(tmp_path: Path) -> None:
    """GDRO's corrected score as a weight-0 reward: in the metrics, not in the advantages."""
    import json

    from tiny import tiny_models

    _, clf = tiny_models(tmp_path)
    digits = {"name": "digit_classifier", "kwargs": {"path": str(clf)}}
    corrected = {"reward": digits, "quality": digits, "pivot": 0.5, "offset": 0.0}
    config = tiny_config(
        tmp_path,
        *ALGORITHMS["gdro"],
        "reward.1.name=corrected_score",
        "reward.1.weight=0",
        f"reward.1.kwargs={json.dumps(corrected)}",
    )
    trainer = Trainer(config, run_dir=tmp_path / "run")
    batch = trainer.collect()
    r = batch.scores["digit_classifier"]
    assert torch.allclose(batch.scores["reward"], r)  # weight 0: the training reward is unchanged
    assert torch.allclose(batch.scores["corrected_score"], r * (r - 0.5), atol=1e-6)
    assert "corrected_score" in trainer.evaluate().scores
