"""Options of the flow algorithms that follow the released codes, against numbers derived by hand
from the references' formulas (each test names the reference file)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tiny import tiny_config

from genrl import Trainer
from genrl.config.errors import ConfigError
from genrl.data.rng import RolloutNoise
from genrl.objectives.losses import ClippedSurrogate, gaussian_mean_kl
from genrl.objectives.regression_objectives import apply_adv_mode
from samplers import DanceSDESampler, FlowCPSSampler, FlowSDESampler, flow_sigmas, shift_sigmas
from samplers.base import gaussian_log_prob
from samplers.scaled_noise import ScaledNoiseSampler
from samplers.windows import sde_window_start

# ----------------------------------------------------------------------------- KL form


def test_reference_kl_divides_by_the_diffusion_coefficient() -> None:
    """Flow-GRPO ``train_sd3.py``: ``mean((mu - mu_ref)^2) / (2 * std_dev_t^2)`` with the
    ``std_dev_t = sqrt(s / (1 - s)) * a`` that ``sde_step_with_logprob`` returns (no
    ``sqrt(-dt)``): the exact KL times ``|dt|``."""
    sigmas = flow_sigmas(10)
    sampler = FlowSDESampler(sigmas, noise_level=0.7)
    step = torch.tensor([3])
    s, s_next = float(sigmas[3]), float(sigmas[4])
    diffusion = 0.7 * math.sqrt(s / (1 - s))
    reference_std = sampler.reference_std(step, torch.zeros(1, 2))
    assert float(reference_std) == pytest.approx(diffusion, rel=1e-6)
    mean, ref = torch.tensor([[0.3, -0.1]]), torch.zeros(1, 2)
    reference = gaussian_mean_kl(mean, ref, reference_std)
    # Differences 0.3, -0.1: mean of squares 0.05, over 2 sigma_s^2.
    assert float(reference) == pytest.approx(0.05 / (2 * diffusion**2), rel=1e-5)
    out = sampler.step(torch.zeros(1, 2), step, torch.zeros(1, 2), prev_sample=torch.zeros(1, 2))
    exact = gaussian_mean_kl(mean, ref, out.std)
    assert float(reference / exact) == pytest.approx(s - s_next, rel=1e-5)
    # CPS and DanceGRPO return the transition std itself: their reference form is exact.
    for other in (FlowCPSSampler(sigmas, 0.8), DanceSDESampler(sigmas, 0.3)):
        o = other.step(torch.zeros(1, 2), step, torch.zeros(1, 2), prev_sample=torch.zeros(1, 2))
        torch.testing.assert_close(other.reference_std(step, torch.zeros(1, 2)), o.std)


def test_the_exact_to_reference_factor_runs_from_4_to_28_on_shift_3() -> None:
    """The docs' claim: ``1 / |dt|`` on the 10-step shift-3 schedule is no constant."""
    sigmas = shift_sigmas(flow_sigmas(10), 3.0)
    factors = 1 / (sigmas[:-1] - sigmas[1:])
    assert float(factors.min()) == pytest.approx(4.0, abs=0.5)
    assert float(factors.max()) == pytest.approx(28.0, abs=1.0)


# --------------------------------------------------------------------------- kl_reward


def test_kl_reward_makes_per_step_advantages(tmp_path: Path) -> None:
    """Flow-GRPO ``train_wan2_1.py``: ``rewards.unsqueeze(-1) - kl_reward * kl`` per step, each
    step's column normalised per prompt; the KL is measured while sampling (exact form)."""
    config = tiny_config(tmp_path, "algorithm.kl_reward=0.5", "policy.lora_rank=4")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    rollout = trainer.collect().rollout
    assert rollout.step_kl is not None and rollout.step_kl.shape == (16, 4)
    # Before any update the policy is the reference: every step's KL is 0.
    assert float(rollout.step_kl.abs().max()) == 0.0
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0] * 4)
    step_kl = torch.zeros(16, 4)
    step_kl[0, 2] = 2.0  # the best sample of group 0 paid KL 2 at step 2
    prompts = [p for p in "abcd" for _ in range(4)]
    got = trainer.objective.advantages(rewards, prompts, torch.arange(16) // 4, step_kl=step_kl)
    assert got.shape == (16, 4)
    # Step 2, group 0: rewards [1 - 0.5 * 2, 0, 0, 0] = 0 everywhere: advantage 0.
    assert got[:4, 2].tolist() == [0.0] * 4
    # Step 0, group 0: [1, 0, 0, 0], mean 0.25, population std sqrt(3)/4 (global std is the
    # same: every group is [1, 0, 0, 0]).
    std = math.sqrt(3) / 4
    torch.testing.assert_close(got[:4, 0], torch.tensor([0.75, -0.25, -0.25, -0.25]) / (std + 1e-4))


# ---------------------------------------------------------------- zero-advantage dropping


def test_zero_advantage_trajectories_are_left_out(tmp_path: Path) -> None:
    """Flow-GRPO ``train_sd3.py``: ``mask = advantages.abs().sum(dim=1) != 0``; samples whose
    advantages are zero at every step are not trained."""
    trainer = Trainer(tiny_config(tmp_path), run_dir=tmp_path / "run")
    batch = trainer.collect()
    rollout = batch.rollout
    rollout.advantages = torch.zeros(16)
    rollout.advantages[[1, 5, 6]] = torch.tensor([0.5, -1.0, 2.0])
    units = trainer.objective.units(trainer.policy, rollout, batch.noise)
    assert sorted(set(units.rows.tolist())) == [1, 5, 6]
    assert len(units) == 3 * trainer.objective.num_train_steps
    keep_all = tiny_config(tmp_path, "algorithm.drop_zero_advantages=false")
    other = Trainer(keep_all, run_dir=tmp_path / "all")
    assert len(other.objective.units(other.policy, rollout, batch.noise)) == 16 * 3
    # All zero: enough zero-advantage trajectories come back to fill the planned minibatch.
    rollout.advantages = torch.zeros(16)
    units = trainer.objective.units(trainer.policy, rollout, batch.noise)
    assert len(units) >= 1 and set(units.advantages.tolist()) == {0.0}


def test_fewer_units_keep_the_planned_number_of_minibatches(tmp_path: Path) -> None:
    """Processes that drop different numbers of trajectories still take the same optimizer
    steps: the planned minibatch count with smaller minibatches."""
    config = tiny_config(tmp_path, "train.minibatch_size=8")  # 48 units planned: 6 minibatches
    trainer = Trainer(config, run_dir=tmp_path / "run")
    updater = trainer.updater
    assert updater.planned_minibatches == 6
    assert [len(c) for c in updater._minibatches(torch.arange(48))] == [8] * 6
    assert [len(c) for c in updater._minibatches(torch.arange(15))] == [3, 3, 3, 2, 2, 2]


# ----------------------------------------------------------------------- GRPO-Guard


def test_ratio_norm_is_the_mean_of_mean_shift_times_noise() -> None:
    """GRPO-Guard (``train_sd3_GRPO_Guard.py``): ``s * (lp - lp_old + mean((mu - mu_old)^2) /
    (2 s^2))`` equals ``mean((mu - mu_old) * eps)`` for the stored ``x = mu_old + s eps``."""
    gen = torch.Generator().manual_seed(0)
    mu_old, shift = torch.randn(3, 8, generator=gen), 0.1 * torch.randn(3, 8, generator=gen)
    s = torch.tensor([0.2, 0.5, 1.0])
    eps = torch.randn(3, 8, generator=gen)
    x = mu_old + s[:, None] * eps
    mu = mu_old + shift
    lp_old = gaussian_log_prob(x, mu_old, s[:, None], "mean")
    lp = gaussian_log_prob(x, mu, s[:, None], "mean")
    guard = s * (lp - lp_old + shift.square().mean(1) / (2 * s.square()))
    torch.testing.assert_close(guard, (shift * eps).mean(1), rtol=1e-5, atol=1e-6)


def test_ratio_norm_trains_with_one_over_dt_weights(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, "algorithm.ratio_norm=true", "algorithm.clip_range=2e-6")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    first = trainer.train_iteration()
    # On policy the guarded ratio is exactly 1 (mu = mu_old).
    assert first["loss/first_minibatch_ratio_deviation"] == 0.0
    after = dict(trainer.policy.network.named_parameters())
    assert any(not torch.equal(p, after[n]) for n, p in before.items())
    with pytest.raises(ConfigError, match="mean-reduced"):
        tiny_config(
            tmp_path, "algorithm.ratio_norm=true", "sampler.log_prob_reduction=sum"
        ).validate()


def test_weighted_surrogate_is_the_reweighted_mean() -> None:
    log_ratio = torch.tensor([0.0, 0.0])
    loss, _ = ClippedSurrogate(1e-3)(
        log_ratio, torch.zeros(2), torch.tensor([1.0, 1.0]), 1 / torch.tensor([0.1, 0.4])
    )
    assert float(loss) == pytest.approx(-(10 + 2.5) / 2)


# -------------------------------------------------------------------- MixGRPO windows


def test_mixgrpo_progressive_window_wraps_back() -> None:
    """MixGRPO ``grpo_states.py``: the start moves by the stride every ``iters_per_group``
    iterations; with ``--roll_back`` it starts again at 0 after the end."""
    starts = [sde_window_start(10, 4, "progressive", i, stride=1, shift_every=2, wrap=True) for i in range(16)]  # fmt: skip
    assert starts == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 0, 0]
    stays = [sde_window_start(10, 4, "progressive", i, stride=1, shift_every=2) for i in range(16)]
    assert stays[-3:] == [6, 6, 6]


def test_mixgrpo_decay_shrinks_the_interval_with_the_position() -> None:
    """MixGRPO's ``decay``: interval ``max(min, int(max (1 - p) + min p))`` with ``p`` the start
    over the last start: for starts 0..6 and 4 -> 1: intervals 4, 3, 3, 2, 2, 1, 1."""
    starts = [sde_window_start(10, 4, "decay", i, shift_every=4, shift_every_min=1) for i in range(18)]  # fmt: skip
    assert starts == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 6, 6, 6]
    wrapped = [sde_window_start(10, 4, "decay", i, shift_every=4, wrap=True) for i in (15, 16)]
    assert wrapped == [6, 0]  # one cycle is 4 + 3 + 3 + 2 + 2 + 1 + 1 = 16 iterations


# ------------------------------------------------------------------ DiffusionNFT, RAM


def test_nft_adv_mode_by_hand() -> None:
    """DiffusionNFT ``train_nft_sd3.py``: after the clip to +-5, ``positive_only`` clamps to
    [0, 5], ``negative_only`` to [-5, 0], ``one_only`` is 1 for A > 0 else 0, ``binary`` the
    sign; r = clamp(A / 10 + 1/2, 0, 1) follows."""
    a = torch.tensor([-5.0, -0.5, 0.0, 2.0, 5.0])
    assert apply_adv_mode(a, "all").tolist() == a.tolist()
    assert apply_adv_mode(a, "positive_only").tolist() == [0.0, 0.0, 0.0, 2.0, 5.0]
    assert apply_adv_mode(a, "negative_only").tolist() == [-5.0, -0.5, 0.0, 0.0, 0.0]
    assert apply_adv_mode(a, "one_only").tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert apply_adv_mode(a, "binary").tolist() == [-1.0, -1.0, 0.0, 1.0, 1.0]


def test_ram_weight_floor(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="flips sign"):
        tiny_config(tmp_path, recipe="digits_ram").apply_overrides(["algorithm.min_weight=-1"]).validate()  # fmt: skip
    config = tiny_config(tmp_path, "algorithm.min_weight=-0.9", recipe="digits_ram")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    metrics = trainer.train_iteration()
    assert 0.0 <= metrics["loss/weight_below_minus_one"] <= 1.0


# --------------------------------------------------------------- BranchGRPO split steps


def test_scaled_noise_keeps_the_drift_and_scores_under_the_base_density() -> None:
    """BranchGRPO ``flux_step_with_split``: ``x = mean + scale * std * noise`` with the base
    step's mean, scored under ``N(mean, std^2)``; ``drawn`` scores under ``N(mean, (scale
    std)^2)``. Re-scoring a drawn sample reproduces its log-prob."""
    base = DanceSDESampler(flow_sigmas(6), 0.3)
    split = ScaledNoiseSampler(base, 4.0)
    gen = torch.Generator().manual_seed(0)
    x, v, noise = (torch.randn(3, 8, generator=gen) for _ in range(3))
    out = split.step(v, 2, x, noise=noise)
    plain = base.step(v, 2, x, noise=noise)
    torch.testing.assert_close(out.mean, plain.mean)
    torch.testing.assert_close(out.prev_sample, plain.mean + 4.0 * plain.std[:, None] * noise)
    torch.testing.assert_close(out.log_prob, gaussian_log_prob(out.prev_sample, out.mean, plain.std[:, None], "mean"))  # fmt: skip
    again = split.step(v, torch.tensor([2, 2, 2]), x, prev_sample=out.prev_sample)
    torch.testing.assert_close(again.log_prob, out.log_prob, rtol=0, atol=0)
    drawn = ScaledNoiseSampler(base, 4.0, "drawn").step(v, 2, x, noise=noise)
    wide = gaussian_log_prob(drawn.prev_sample, drawn.mean, 4.0 * plain.std[:, None], "mean")
    torch.testing.assert_close(drawn.log_prob, wide)
    # Scale 1 is the base step exactly.
    torch.testing.assert_close(ScaledNoiseSampler(base, 1.0).step(v, 2, x, noise=noise).prev_sample, plain.prev_sample, rtol=0, atol=0)  # fmt: skip


def test_dropping_and_the_noise_stream_are_reproducible(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(tmp_path), run_dir=tmp_path / "run")
    batch = trainer.collect()
    rollout = batch.rollout
    rollout.advantages = torch.zeros(16)
    noise = RolloutNoise(0, 3, 16, slice(0, 16))
    a = trainer.objective.units(trainer.policy, rollout, noise)
    b = trainer.objective.units(trainer.policy, rollout, noise)
    assert torch.equal(a.rows, b.rows)


# ---------------------------------------------------------------- MC-GRPO's median baseline


def test_median_advantages_leave_the_pivots_out_of_flow_grpo(tmp_path: Path) -> None:
    """``advantage=median`` on Flow-GRPO: groups of 3 centred on their median, the median
    trajectory of each group never becomes a transition; two iterations train."""
    from genrl.objectives.advantages import median_centered_advantages

    config = tiny_config(
        tmp_path,
        "train.group_size=3",
        "algorithm.advantage=median",
        "algorithm.drop_zero_advantages=false",
    )
    trainer = Trainer(config, run_dir=tmp_path / "run")
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    batch = trainer.collect()
    rewards = batch.scores[trainer.reward.name]
    expected, pivots = median_centered_advantages(rewards, batch.group_ids)
    torch.testing.assert_close(batch.rollout.advantages, expected)
    assert torch.equal(batch.rollout.excluded, pivots) and int(pivots.sum()) == 4
    units = trainer.objective.units(trainer.policy, batch.rollout.without_excluded(), batch.noise)
    kept_rows = (~pivots).nonzero()[:, 0]
    assert len(units) == 8 * trainer.objective.num_train_steps
    assert torch.equal(units.advantages.unique(), expected[kept_rows].unique())
    trainer.train_iteration()
    trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    assert sum(not torch.equal(p, after[n]) for n, p in before.items()) >= 0.9 * len(before)
    with pytest.raises(ConfigError, match="kl_reward=0"):
        tiny_config(tmp_path, "train.group_size=3", "algorithm.advantage=median",
                    "algorithm.kl_reward=0.1").validate()  # fmt: skip
