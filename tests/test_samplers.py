"""Tests of the flow samplers: schedules, the Euler ODE step and the Gaussian steps (Flow-GRPO SDE,
DanceGRPO SDE, coefficients-preserving sampling).

Expected numbers are worked out by hand in the comments; diffusers' scheduler is the reference for
the ODE step. Properties every Gaussian sampler must have are parametrized over all three.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from samplers import (
    LOG_PROB_REDUCTIONS,
    SAMPLERS,
    DanceSDESampler,
    FlowCPSSampler,
    FlowODESampler,
    FlowSDELinearSampler,
    FlowSDESampler,
    GaussianFlowSampler,
    StepOutput,
    flow_sigmas,
    gaussian_log_prob,
    shift_sigmas,
)
from samplers.base import per_sample, reduce_event

HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)  # 0.9189385...

# The Gaussian samplers and the largest noise level each accepts in the property tests (CPS's
# noise level is an angle fraction in [0, 1]; the SDEs' is an unbounded scale).
STOCHASTIC = [FlowSDESampler, FlowSDELinearSampler, DanceSDESampler, FlowCPSSampler]
MAX_NOISE = {
    FlowSDESampler: 1.5,
    FlowSDELinearSampler: 1.5,
    DanceSDESampler: 1.5,
    FlowCPSSampler: 1.0,
}


def _trajectory(sampler, batch, event, seed):
    """Sample a full SDE trajectory with random velocities; return per-step inputs and outputs."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, *event), generator=gen)
    states, velocities, nexts, log_probs = [], [], [], []
    for i in range(sampler.num_steps):
        v = torch.randn((batch, *event), generator=gen)
        out = sampler.step(v, i, x, generator=gen)
        states.append(x)
        velocities.append(v)
        nexts.append(out.prev_sample)
        log_probs.append(out.log_prob)
        x = out.prev_sample
    return (
        torch.stack(states, 1),
        torch.stack(velocities, 1),
        torch.stack(nexts, 1),
        torch.stack(log_probs, 1),
    )


# ---------------------------------------------------------------- schedules


def test_flow_sigmas_linear_by_hand():
    # linspace(1, 0, 5) = [1, 0.75, 0.5, 0.25, 0]; shift 1 leaves it unchanged.
    sigmas = flow_sigmas(4)
    assert sigmas.dtype == torch.float32
    assert sigmas.shape == (5,)
    assert torch.equal(sigmas, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))


def test_flow_sigmas_shifted_by_hand():
    # shift 3: s' = 3s / (1 + 2s); s = 0.5 -> 1.5 / 2 = 0.75; endpoints 1 -> 1 and 0 -> 0.
    assert torch.allclose(flow_sigmas(2, shift=3.0), torch.tensor([1.0, 0.75, 0.0]))
    # s = 0.25 -> 0.75 / 1.5 = 0.5; s = 0.75 -> 2.25 / 2.5 = 0.9.
    shifted = shift_sigmas(torch.tensor([0.25, 0.75]), 3.0)
    assert torch.allclose(shifted, torch.tensor([0.5, 0.9]))
    # shift 0.5 (towards low noise): s = 0.5 -> 0.25 / (1 - 0.5 * 0.5) = 0.25 / 0.75 = 1/3.
    assert torch.allclose(shift_sigmas(torch.tensor([0.5]), 0.5), torch.tensor([1.0 / 3.0]))


def test_schedule_errors():
    with pytest.raises(ValueError, match="num_steps"):
        flow_sigmas(0)
    with pytest.raises(ValueError, match="shift"):
        shift_sigmas(torch.tensor([0.5]), 0.0)
    with pytest.raises(ValueError, match="shift"):
        flow_sigmas(4, shift=-1.0)


# ---------------------------------------------------------------- base helpers


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gaussian_log_prob_matches_torch_normal(reduction):
    gen = torch.Generator().manual_seed(0)
    value = torch.randn(3, 4, 5, generator=gen)
    mean = torch.randn(3, 4, 5, generator=gen)
    std = torch.tensor([0.3, 1.0, 2.5]).reshape(3, 1, 1)
    expected = torch.distributions.Normal(mean, std.expand_as(mean)).log_prob(value)
    expected = expected.mean(dim=(1, 2)) if reduction == "mean" else expected.sum(dim=(1, 2))
    got = gaussian_log_prob(value, mean, std, reduction)
    assert got.shape == (3,)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_gaussian_log_prob_by_hand():
    # One sample, two elements, std 2: z = (3 - 1) / 2 = 1 and z = (1 - 1) / 2 = 0.
    # log N = -z^2/2 - log 2 - log sqrt(2 pi): -0.5 - 0.6931472 - 0.9189385 = -2.1120857
    # and 0 - 0.6931472 - 0.9189385 = -1.6120857. Sum -3.7241714, mean -1.8620857.
    value = torch.tensor([[3.0, 1.0]])
    mean = torch.tensor([[1.0, 1.0]])
    std = torch.tensor([[2.0]])
    assert gaussian_log_prob(value, mean, std, "sum").item() == pytest.approx(-3.7241714, abs=1e-6)
    assert gaussian_log_prob(value, mean, std, "mean").item() == pytest.approx(-1.8620857, abs=1e-6)


def test_reduce_event_and_per_sample():
    values = torch.arange(12.0).reshape(2, 3, 2)
    # Row 0 holds 0..5 (sum 15, mean 2.5); row 1 holds 6..11 (sum 51, mean 8.5).
    assert torch.equal(reduce_event(values, "sum"), torch.tensor([15.0, 51.0]))
    assert torch.equal(reduce_event(values, "mean"), torch.tensor([2.5, 8.5]))
    with pytest.raises(ValueError, match="log_prob_reduction"):
        reduce_event(values, "max")
    with pytest.raises(ValueError, match="log_prob_reduction"):
        gaussian_log_prob(values, values, torch.ones(2, 1, 1), "median")
    assert per_sample(0.5, values).shape == (2, 1, 1)
    assert torch.equal(
        per_sample(torch.tensor([1.0, 2.0]), values).flatten(), torch.tensor([1.0, 2.0])
    )
    with pytest.raises(ValueError, match="batch has 2"):
        per_sample(torch.tensor([1.0, 2.0, 3.0]), values)


def test_registry_and_reductions():
    assert set(SAMPLERS) == {"flow_ode", "flow_sde", "flow_sde_linear", "dance_sde", "flow_cps"}
    assert SAMPLERS["flow_ode"] is FlowODESampler and SAMPLERS["flow_sde"] is FlowSDESampler
    assert SAMPLERS["dance_sde"] is DanceSDESampler and SAMPLERS["flow_cps"] is FlowCPSSampler
    assert LOG_PROB_REDUCTIONS == ("mean", "sum")
    assert not FlowODESampler.stochastic
    for cls in STOCHASTIC:
        assert cls.stochastic and issubclass(cls, GaussianFlowSampler)


def test_the_catalog_agrees_with_the_classes():
    """``samplers.catalog`` (read by the config checks before torch loads) names each class of
    ``SAMPLERS`` with its own ``stochastic`` flag and ``noise_level`` range."""
    from samplers.catalog import SAMPLER_CATALOG

    assert list(SAMPLER_CATALOG) == list(SAMPLERS)
    for name, entry in SAMPLER_CATALOG.items():
        cls = SAMPLERS[name]
        assert entry.target == f"{cls.__module__}:{cls.__name__}", name
        assert entry.stochastic == cls.stochastic, name
        default = (0.0, float("inf"))
        assert entry.noise_level_range == getattr(cls, "noise_level_range", default), name


# ---------------------------------------------------------------- ODE step


def test_ode_step_by_hand():
    # sigmas [1, 0.5, 0]; step 1 moves 0.5 -> 0: x + (0 - 0.5) * v = 1 - 0.5 * 2 = 0.
    # step 0 moves 1 -> 0.5: 1 - 0.5 * 2 = 0 as well; use x = 3 there: 3 - 1 = 2.
    ode = FlowODESampler(torch.tensor([1.0, 0.5, 0.0]))
    assert ode.num_steps == 2
    out = ode.step(torch.tensor([[2.0]]), 1, torch.tensor([[1.0]]))
    assert isinstance(out, StepOutput)
    assert out.prev_sample.item() == 0.0 and out.mean.item() == 0.0
    assert torch.equal(out.log_prob, torch.zeros(1)) and torch.equal(out.std, torch.zeros(1))
    assert ode.step(torch.tensor([[2.0]]), 0, torch.tensor([[3.0]])).prev_sample.item() == 2.0
    # A given prev_sample is passed through unchanged (ODE standing in for a stochastic step).
    given_prev = torch.tensor([[7.0]])
    assert (
        ode.step(
            torch.tensor([[2.0]]), 1, torch.tensor([[1.0]]), prev_sample=given_prev
        ).prev_sample
        is given_prev
    )


@pytest.mark.parametrize(
    ("num_steps", "shift"), [(1, 1.0), (4, 1.0), (10, 3.0), (28, 3.0), (7, 0.5)]
)
def test_flow_sigmas_equal_diffusers_schedule(num_steps, shift):
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    # The SD3/FLUX pipelines pass the unshifted sigmas linspace(1, 1/n, n); the scheduler shifts
    # them and appends the terminal 0. (``set_timesteps(n)`` alone ends at the shifted
    # sigma_min = 1/1000 instead of 0, so it is a different schedule on purpose.)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1.0 / num_steps, num_steps))
    torch.testing.assert_close(scheduler.sigmas, flow_sigmas(num_steps, shift), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("num_steps", "shift"), [(1, 1.0), (4, 1.0), (10, 3.0), (28, 3.0)])
def test_ode_step_equals_diffusers_euler_step(num_steps, shift):
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1.0 / num_steps, num_steps))
    ours_same_sigmas = FlowODESampler(scheduler.sigmas.clone())
    ours = FlowODESampler(flow_sigmas(num_steps, shift))
    gen = torch.Generator().manual_seed(num_steps)
    x = torch.randn(2, 4, 8, 8, generator=gen)
    for i, t in enumerate(scheduler.timesteps):
        v = torch.randn(2, 4, 8, 8, generator=gen)
        reference = scheduler.step(v, t, x).prev_sample
        torch.testing.assert_close(
            ours_same_sigmas.step(v, i, x).prev_sample, reference, rtol=0, atol=1e-6
        )
        torch.testing.assert_close(ours.step(v, i, x).prev_sample, reference, rtol=0, atol=1e-6)
        x = reference


def test_ode_accepts_per_sample_indices():
    # sigmas [1, .75, .5, .25, 0]: sample 0 at step 0 (dt -0.25), sample 1 at step 3 (dt -0.25),
    # sample 2 at step 1 (dt -0.25): all moves are x - 0.25 v. With x = 1, v = [4, 8, -4]:
    # [0, -1, 2].
    ode = FlowODESampler(flow_sigmas(4))
    out = ode.step(torch.tensor([[4.0], [8.0], [-4.0]]), torch.tensor([0, 3, 1]), torch.ones(3, 1))
    assert torch.equal(out.prev_sample, torch.tensor([[0.0], [-1.0], [2.0]]))


# ---------------------------------------------------------------- SDE step: hand-computed


@pytest.mark.parametrize("cls", STOCHASTIC)
def test_sde_noise_argument_and_generator_reproducibility(cls):
    sde = cls(flow_sigmas(5), noise_level=0.7)
    gen = torch.Generator().manual_seed(3)
    x, v = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 3, 4, generator=gen)
    noise = torch.randn(2, 3, 4, generator=gen)
    out = sde.step(v, 2, x, noise=noise)
    torch.testing.assert_close(out.prev_sample, out.mean + out.std.reshape(2, 1, 1) * noise)
    a = sde.step(v, 2, x, generator=torch.Generator().manual_seed(11))
    b = sde.step(v, 2, x, generator=torch.Generator().manual_seed(11))
    assert torch.equal(a.prev_sample, b.prev_sample) and torch.equal(a.log_prob, b.log_prob)
    assert out.log_prob.shape == (2,) and out.std.shape == (2,) and out.mean.shape == (2, 3, 4)
    assert out.prev_sample.dtype == torch.float32


@pytest.mark.parametrize("cls", STOCHASTIC)
def test_stochastic_steps_mark_the_steps_with_positive_std(cls):
    sampler = cls(flow_sigmas(4))
    steps = sampler.stochastic_steps
    assert steps.dtype == torch.bool and steps.shape == (4,)
    # Only CPS has a zero std at the last step (s_next = 0); the SDEs keep eta * sqrt(-dt) there.
    assert steps.tolist() == [True, True, True, cls is not FlowCPSSampler]
    x = torch.zeros(4, 2)
    assert torch.equal(sampler.step(x, torch.arange(4), x).std > 0, steps)
    assert not cls(flow_sigmas(4), noise_level=0.0).stochastic_steps.any()
    assert cls(torch.tensor([1.0, 0.5, 0.1])).stochastic_steps.all()  # stops short of 0
    assert torch.equal(FlowODESampler(flow_sigmas(4)).stochastic_steps, torch.zeros(4, dtype=bool))


# ---------------------------------------------------------------- re-scoring


@pytest.mark.parametrize("cls", STOCHASTIC)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_sde_rescoring_reproduces_log_prob_int_index(cls, reduction, shift):
    sde = cls(flow_sigmas(6, shift), noise_level=0.7, log_prob_reduction=reduction)
    states, velocities, nexts, log_probs = _trajectory(sde, batch=3, event=(2, 3, 3), seed=0)
    for i in range(sde.num_steps):  # includes step 0 (s = 1) and the last step (to s = 0)
        out = sde.step(velocities[:, i], i, states[:, i], prev_sample=nexts[:, i])
        assert torch.equal(out.log_prob, log_probs[:, i])
        assert torch.equal(out.prev_sample, nexts[:, i])
        assert torch.isfinite(out.log_prob).all()


@pytest.mark.parametrize("cls", STOCHASTIC)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_sde_rescoring_reproduces_log_prob_per_sample_indices(cls, reduction):
    sde = cls(flow_sigmas(5, 3.0), noise_level=0.9, log_prob_reduction=reduction)
    batch, steps = 4, sde.num_steps
    states, velocities, nexts, log_probs = _trajectory(sde, batch=batch, event=(3, 4), seed=1)
    # Flatten to (sample, step) transitions and shuffle, as training does.
    flat = lambda t: t.reshape(batch * steps, *t.shape[2:])  # noqa: E731
    index = torch.arange(steps).repeat(batch)
    order = torch.randperm(batch * steps, generator=torch.Generator().manual_seed(5))
    out = sde.step(
        flat(velocities)[order],
        index[order],
        flat(states)[order],
        prev_sample=flat(nexts)[order],
    )
    assert torch.equal(out.log_prob, log_probs.reshape(-1)[order])
    assert torch.isfinite(out.log_prob).all()


@pytest.mark.parametrize("cls", STOCHASTIC)
def test_sde_rescoring_other_velocity_changes_log_prob_and_sum_is_mean_times_size(cls):
    sde_mean = cls(flow_sigmas(4), log_prob_reduction="mean")
    sde_sum = cls(flow_sigmas(4), log_prob_reduction="sum")
    states, velocities, nexts, log_probs = _trajectory(sde_mean, batch=2, event=(5, 6), seed=2)
    summed = sde_sum.step(velocities[:, 1], 1, states[:, 1], prev_sample=nexts[:, 1]).log_prob
    torch.testing.assert_close(summed, 30 * log_probs[:, 1], rtol=1e-5, atol=1e-4)
    moved = sde_mean.step(velocities[:, 1] + 0.1, 1, states[:, 1], prev_sample=nexts[:, 1])
    assert not torch.allclose(moved.log_prob, log_probs[:, 1])


@pytest.mark.parametrize("cls", STOCHASTIC)
def test_sde_log_prob_gradient_flows_through_mean_only(cls):
    sde = cls(flow_sigmas(4))
    v = torch.randn(2, 3, requires_grad=True)
    prev = torch.randn(2, 3, requires_grad=True)
    out = sde.step(v, 1, torch.randn(2, 3), prev_sample=prev)
    out.log_prob.sum().backward()
    assert v.grad is not None and torch.isfinite(v.grad).all() and v.grad.abs().sum() > 0
    assert prev.grad is None


@pytest.mark.parametrize("cls", STOCHASTIC)
@settings(max_examples=60, deadline=None, database=None)
@given(
    batch=st.integers(1, 4),
    event=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    num_steps=st.integers(1, 12),
    shift=st.floats(0.5, 4.0),
    reduction=st.sampled_from(["mean", "sum"]),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_sde_rescoring_property(cls, batch, event, num_steps, shift, reduction, seed, data):
    noise_level = data.draw(st.floats(0.05, MAX_NOISE[cls]))
    sde = cls(flow_sigmas(num_steps, shift), noise_level, reduction)
    indices = data.draw(st.lists(st.integers(0, num_steps - 1), min_size=batch, max_size=batch))
    index = torch.tensor(indices)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, *event), generator=gen)
    v = torch.randn((batch, *event), generator=gen)
    drawn = sde.step(v, index, x, generator=gen)
    rescored = sde.step(v, index, x, prev_sample=drawn.prev_sample)
    assert torch.isfinite(drawn.log_prob).all()
    assert torch.isfinite(drawn.prev_sample).all()
    assert torch.equal(rescored.log_prob, drawn.log_prob)
    assert torch.equal(drawn.std > 0, sde.stochastic_steps[index])
    # Per-sample indices give what each sample's own int-index step gives.
    for b, i in enumerate(indices):
        single = sde.step(v[b : b + 1], i, x[b : b + 1], prev_sample=drawn.prev_sample[b : b + 1])
        torch.testing.assert_close(single.log_prob, drawn.log_prob[b : b + 1], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(single.mean, drawn.mean[b : b + 1], rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- noise 0 = ODE


@pytest.mark.parametrize("cls", STOCHASTIC)
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_sde_with_zero_noise_is_the_ode_step(cls, shift):
    sigmas = flow_sigmas(5, shift)
    sde = cls(sigmas, noise_level=0.0)
    ode = FlowODESampler(sigmas)
    gen = torch.Generator().manual_seed(4)
    for i in range(5):  # step 0 (s = 1) through the last step (to 0)
        x = torch.randn(3, 2, 4, generator=gen)
        v = torch.randn(3, 2, 4, generator=gen)
        s_out = sde.step(v, i, x, generator=gen)
        o_out = ode.step(v, i, x)
        assert torch.equal(s_out.prev_sample, o_out.prev_sample)
        assert torch.equal(s_out.mean, o_out.mean)
        assert torch.equal(s_out.log_prob, torch.zeros(3))
        assert torch.equal(s_out.std, torch.zeros(3))
        # Re-scoring the ODE result: the ratio against itself is exactly 1.
        again = sde.step(v, i, x, prev_sample=s_out.prev_sample)
        assert torch.equal(torch.exp(again.log_prob - s_out.log_prob), torch.ones(3))


# ---------------------------------------------------------------- statistics of the draws


@pytest.mark.parametrize(
    ("cls", "steps"),
    # CPS's step 3 is deterministic (to s = 0), so its draws are checked at steps 0-2.
    [(FlowSDESampler, [0, 1, 3]), (DanceSDESampler, [0, 1, 3]), (FlowCPSSampler, [0, 1, 2])],
)
def test_sde_draws_have_the_stated_mean_and_std(cls, steps):
    sde = cls(flow_sigmas(4), noise_level=0.7)
    n = 40_000
    x = torch.tensor([[0.3], [-1.0], [2.0]]).expand(3, n)
    v = torch.tensor([[1.5], [0.5], [-2.0]]).expand(3, n)
    out = sde.step(v, torch.tensor(steps), x, generator=torch.Generator().manual_seed(0))
    empirical_mean = out.prev_sample.mean(dim=1)
    empirical_std = out.prev_sample.std(dim=1)
    # Standard error of the mean is std / sqrt(n) = std / 200; allow 5 of them.
    assert torch.all((empirical_mean - out.mean[:, 0]).abs() < 5 * out.std / 200)
    torch.testing.assert_close(empirical_std, out.std, rtol=0.02, atol=0)
