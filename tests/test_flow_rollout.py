"""ODE/SDE windows (Flow-GRPO-Fast, MixGRPO) and shared initial noise in flow rollouts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny import tiny_config

from genrl.config.errors import ConfigError
from genrl.data.rng import RolloutNoise, Streams
from genrl.loop.groups import expand_groups
from genrl.loop.trainer import Trainer
from samplers.windows import sde_window_mask, sde_window_start


def test_progressive_window_slides_then_stays_at_the_end() -> None:
    starts = [
        sde_window_start(10, 4, "progressive", it, stride=2, shift_every=3) for it in range(15)
    ]
    assert starts == [0, 0, 0, 2, 2, 2, 4, 4, 4, 6, 6, 6, 6, 6, 6]


def test_random_window_start_is_reproducible_and_in_range() -> None:
    def draw(seed: int) -> int:
        generator = torch.Generator().manual_seed(seed)
        return sde_window_start(10, 2, "random", 0, generator, window_range=(1, 6))

    starts = [draw(seed) for seed in range(200)]
    assert set(starts) == {1, 2, 3, 4}
    assert starts == [draw(seed) for seed in range(200)]


def test_window_mask() -> None:
    assert sde_window_mask(5, 2, 1).tolist() == [False, True, True, False, False]
    assert sde_window_mask(3, 0, 0).tolist() == [True, True, True]
    with pytest.raises(ValueError, match="window_size"):
        sde_window_start(4, 5, "random", 0)
    with pytest.raises(ValueError, match="range"):
        sde_window_start(4, 2, "random", 0, window_range=(0, 5))
    with pytest.raises(ValueError, match="range"):
        sde_window_start(4, 3, "random", 0, window_range=(1, 3))


def _trainer(tmp_path: Path, *overrides: str) -> Trainer:
    return Trainer(tiny_config(tmp_path, *overrides), run_dir=tmp_path / "run")


def _collect(trainer: Trainer, iteration: int = 0):
    cfg = trainer.config
    prompts = trainer.prompts.sample(cfg.train.prompts_per_iteration, cfg.seed, iteration)
    all_prompts, group_ids = expand_groups(prompts, cfg.train.group_size)
    noise = RolloutNoise(cfg.seed, iteration, len(all_prompts), slice(0, len(all_prompts)))
    return trainer.rollout.collect(trainer.policy, all_prompts, group_ids, noise), noise


def test_fast_rollout_shares_the_ode_prefix_within_a_group(tmp_path: Path) -> None:
    trainer = _trainer(
        tmp_path,
        "sampler.num_steps=6",
        "sampler.sde_window_size=2",
        "sampler.sde_window_range=[2, 5]",
        "sampler.same_initial_noise=true",
    )
    calls: list[int] = []
    velocity = trainer.policy.velocity
    trainer.policy.velocity = lambda x, *a, **k: calls.append(len(x)) or velocity(x, *a, **k)
    rollout, _ = _collect(trainer)
    window = rollout.trainable_steps[0]
    start = int(window.float().argmax())
    assert start in (2, 3) and int(window.sum()) == 2
    assert (rollout.trainable_steps == window).all()
    # The prefix ran once per group (4 groups), the rest for all 16 samples.
    assert calls == [4] * start + [16] * (6 - start)
    latents = rollout.latents.view(4, 4, *rollout.latents.shape[1:])  # [groups, members, ...]
    shared = latents[:, :, : start + 1]
    assert torch.equal(shared, shared[:, :1].expand_as(shared))
    branched = latents[:, :, start + 1]
    assert not torch.equal(branched[:, 0], branched[:, 1])
    # Log-probs only inside the window.
    assert (rollout.log_probs[:, ~window] == 0).all()
    assert (rollout.log_probs[:, window] != 0).all()


def test_fast_rollout_equals_per_sample_ode_prefix(tmp_path: Path) -> None:
    """Computing the prefix once per group gives the states of running every sample (the
    sharing is an optimisation, not an approximation; batch size changes only the last bits)."""
    settings = (
        "sampler.num_steps=5",
        "sampler.sde_window_size=1",
        "sampler.same_initial_noise=true",
    )
    trainer = _trainer(tmp_path, *settings, "sampler.sde_window_range=[3, 4]")
    shared, _ = _collect(trainer)
    # Same noise, window at the start: every step runs for all samples.
    unshared = _trainer(tmp_path, *settings, "sampler.sde_window_range=[0, 1]")
    full, _ = _collect(unshared)
    assert torch.equal(shared.latents[:, 0], full.latents[:, 0])
    # Reference: the plain ODE from the shared initial noise, run for every sample.
    policy, ode = trainer.policy, trainer.rollout.ode
    x, condition = shared.latents[:, 0], policy.encode_prompts(shared.prompts)
    for i in range(3):
        v = policy.velocity(x, ode.sigmas[i].expand(len(x)), condition)
        x = ode.step(v, i, x).prev_sample
        assert torch.allclose(shared.latents[:, i + 1], x, atol=1e-6, rtol=0)


def test_window_steps_are_the_only_training_units(tmp_path: Path) -> None:
    trainer = _trainer(
        tmp_path,
        "sampler.num_steps=6",
        "sampler.sde_window_size=3",
        "sampler.sde_window_schedule=progressive",
        "sampler.sde_window_shift_every=1",
        "algorithm.timestep_fraction=1.0",
    )
    assert trainer.objective.num_train_steps == 3
    rollout, noise = _collect(trainer, iteration=2)
    rollout.advantages = torch.randn(len(rollout))
    units = trainer.objective.units(trainer.policy, rollout, noise)
    assert len(units) == 3 * len(rollout)
    assert set(units.timestep_index.tolist()) == {2, 3, 4}  # progressive: start = iteration
    metrics = trainer.train_iteration()
    assert metrics["loss/first_minibatch_ratio_deviation"] == 0.0


def test_window_settings_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sde_window_size"):
        tiny_config(tmp_path, "sampler.sde_window_size=9").validate()
    with pytest.raises(ConfigError, match="sde_window_range"):
        tiny_config(
            tmp_path, "sampler.sde_window_size=2", "sampler.sde_window_range=[1, 2]"
        ).validate()


def test_no_window_and_independent_noise_is_the_plain_flow_grpo_rollout(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    rollout, noise = _collect(trainer)
    policy, sde = trainer.policy, trainer.rollout.sampler
    x = noise.randn(Streams.INITIAL_NOISE, policy.latent_shape)
    condition = policy.encode_prompts(rollout.prompts)
    assert torch.equal(rollout.latents[:, 0], x)
    for i in range(sde.num_steps):
        v = policy.velocity(x, sde.sigmas[i].expand(len(x)), condition)
        out = sde.step(v, i, x, noise=noise.randn((Streams.STEP_NOISE, i), policy.latent_shape))
        assert torch.equal(rollout.log_probs[:, i], out.log_prob)
        x = out.prev_sample
    assert torch.equal(rollout.final, x)
    assert rollout.trainable_steps.all()


def test_rollout_in_chunks_matches_one_batch(tmp_path: Path) -> None:
    whole, _ = _collect(_trainer(tmp_path))
    chunked, _ = _collect(_trainer(tmp_path, "train.rollout_batch_size=3"))
    assert torch.allclose(whole.latents, chunked.latents, atol=1e-5, rtol=0)
    assert torch.allclose(whole.log_probs, chunked.log_probs, atol=1e-4, rtol=0)


def test_cps_window_trains_every_window_step_when_it_cannot_reach_the_last_step(
    tmp_path: Path,
) -> None:
    """CPS's last step is deterministic; a window that cannot reach it trains all its steps,
    one that can is planned for the worst case."""
    common = ("sampler.name=flow_cps", "sampler.num_steps=8", "sampler.sde_window_size=3")
    inside = _trainer(tmp_path, *common, "sampler.sde_window_range=[0, 7]")
    assert inside.rollout.trainable_per_trajectory == 3
    reaching = _trainer(tmp_path, *common, "sampler.sde_window_range=[0, 8]")
    assert reaching.rollout.trainable_per_trajectory == 2
    progressive = _trainer(
        tmp_path, *common, "sampler.sde_window_schedule=progressive", "sampler.sde_window_stride=2"
    )
    assert progressive.rollout.possible_window_starts() == [0, 2, 4, 5]
    assert progressive.rollout.trainable_per_trajectory == 2


def test_noise_per_group_is_shared_and_independent_of_the_slice() -> None:
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    whole = RolloutNoise(3, 7, 6, slice(0, 6)).randn_per_group(
        Streams.INITIAL_NOISE, (2,), groups, 3
    )
    assert torch.equal(whole[0], whole[1]) and not torch.equal(whole[1], whole[2])
    second_half = RolloutNoise(3, 7, 6, slice(3, 6)).randn_per_group(
        Streams.INITIAL_NOISE, (2,), groups[3:], 3
    )
    assert torch.equal(second_half, whole[3:])
    with pytest.raises(ValueError, match="group ids"):
        RolloutNoise(3, 7, 6, slice(0, 6)).randn_per_group(
            Streams.INITIAL_NOISE, (2,), groups + 1, 3
        )


def test_window_and_sampler_settings_that_cannot_apply_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="random window only"):
        tiny_config(
            tmp_path,
            "sampler.sde_window_size=2",
            "sampler.sde_window_schedule=progressive",
            "sampler.sde_window_range=[0, 4]",
        ).validate()
    with pytest.raises(ConfigError, match="random window only"):
        tiny_config(tmp_path, "sampler.sde_window_range=[0, 4]").validate()
    with pytest.raises(ConfigError, match=r"noise_level must lie in \[0.0, 1.0\]"):
        tiny_config(tmp_path, "sampler.name=flow_cps", "sampler.noise_level=1.2").validate()


def test_cps_window_that_only_covers_the_last_step_is_explained(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="deterministic steps only"):
        _trainer(
            tmp_path,
            "sampler.name=flow_cps",
            "sampler.num_steps=4",
            "sampler.sde_window_size=1",
            "sampler.sde_window_range=[3, 4]",
        )
