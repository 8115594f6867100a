"""Stochastic sampler steps against hand-computed numbers: the Flow-GRPO SDE, the DanceGRPO SDE
and coefficients-preserving sampling (CPS)."""

from __future__ import annotations

import math

import pytest
import torch

from samplers import (
    DanceSDESampler,
    FlowCPSSampler,
    FlowSDELinearSampler,
    FlowSDESampler,
    flow_sigmas,
)

HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)  # 0.9189385...

# The Gaussian samplers and the largest noise level each accepts in the property tests (CPS's
# noise level is an angle fraction in [0, 1]; the SDEs' is an unbounded scale).


def test_sde_mean_std_by_hand_middle_step():
    # sigmas [1, 0.5, 0], a = 0.7, x = 1, v = 2, step 1: s = 0.5, dt = -0.5.
    # g = 0.7 * sqrt(0.5 / (1 - 0.5)) = 0.7; g^2 = 0.49; g^2 / (2s) = 0.49.
    # x coefficient: 1 + 0.49 * (-0.5) = 0.755.
    # v coefficient: (1 + 0.49 * (1 - 0.5)) * (-0.5) = 1.245 * (-0.5) = -0.6225.
    # mean = 0.755 * 1 + 2 * (-0.6225) = -0.49; std = 0.7 * sqrt(0.5) = 0.4949747.
    sde = FlowSDESampler(torch.tensor([1.0, 0.5, 0.0]), noise_level=0.7)
    x = torch.ones(1, 2)
    v = torch.full((1, 2), 2.0)
    out = sde.step(v, 1, x, noise=torch.zeros(1, 2))
    torch.testing.assert_close(out.mean, torch.full((1, 2), -0.49), rtol=0, atol=1e-6)
    torch.testing.assert_close(out.std, torch.tensor([0.4949747]), rtol=0, atol=1e-6)
    # Zero noise: the draw is the mean itself.
    assert torch.equal(out.prev_sample, out.mean)
    # Noise (+1, -1): x_next = mean +- std; each element has z^2 = 1, so
    # log N = -0.5 - log(0.4949747) - 0.9189385 = -0.5 + 0.7033141 - 0.9189385 = -0.7156900.
    out = sde.step(v, 1, x, noise=torch.tensor([[1.0, -1.0]]))
    torch.testing.assert_close(
        out.prev_sample, torch.tensor([[-0.49 + 0.4949747, -0.49 - 0.4949747]])
    )
    assert out.log_prob.item() == pytest.approx(-0.7156900, abs=1e-5)
    sde_sum = FlowSDESampler(
        torch.tensor([1.0, 0.5, 0.0]), noise_level=0.7, log_prob_reduction="sum"
    )
    out_sum = sde_sum.step(v, 1, x, noise=torch.tensor([[1.0, -1.0]]))
    assert out_sum.log_prob.item() == pytest.approx(2 * -0.7156900, abs=1e-5)


def test_sde_step_zero_uses_next_sigma_in_diffusion_coefficient():
    # Step 0 of sigmas [1, 0.5, 0]: s = 1 would divide by zero in sqrt(s / (1 - s)); the rule
    # replaces 1 - s by 1 - sigmas[1] = 0.5: g = 0.7 * sqrt(1 / 0.5) = 0.7 * sqrt(2) = 0.9899495,
    # g^2 = 0.98, g^2 / (2s) = 0.49, dt = -0.5.
    # x coefficient: 1 + 0.49 * (-0.5) = 0.755. The v coefficient keeps the true s in (1 - s) = 0:
    # (1 + 0.49 * 0) * (-0.5) = -0.5 (as in the Flow-GRPO reference code).
    # mean = 0.755 * 1 + 2 * (-0.5) = -0.245; std = 0.9899495 * sqrt(0.5) = 0.7.
    sde = FlowSDESampler(torch.tensor([1.0, 0.5, 0.0]), noise_level=0.7)
    torch.testing.assert_close(
        sde.diffusion_coefficient(torch.tensor([1.0, 0.5])), torch.tensor([0.9899495, 0.7])
    )
    out = sde.step(torch.tensor([[2.0]]), 0, torch.tensor([[1.0]]), noise=torch.tensor([[1.0]]))
    torch.testing.assert_close(out.mean, torch.tensor([[-0.245]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(out.std, torch.tensor([0.7]), rtol=0, atol=1e-6)
    # z = 1: log N = -0.5 - log 0.7 - 0.9189385 = -0.5 + 0.3566749 - 0.9189385 = -1.0622636.
    assert out.log_prob.item() == pytest.approx(-1.0622636, abs=1e-5)
    assert torch.isfinite(out.log_prob).all()


def test_sde_last_step_to_zero_by_hand():
    # sigmas [1, 0.75, 0.5, 0.25, 0], a = 0.5, step 3: s = 0.25, dt = -0.25.
    # g = 0.5 * sqrt(0.25 / 0.75) = 0.5 / sqrt(3) = 0.2886751; g^2 = 1/12; g^2 / (2s) = 1/6.
    # x coefficient: 1 - 0.25 / 6 = 0.9583333; v coefficient: (1 + 0.75 / 6) * (-0.25) = -0.28125.
    # x = 2, v = -1: mean = 1.9166667 + 0.28125 = 2.1979167; std = 0.2886751 * 0.5 = 0.1443376.
    sde = FlowSDESampler(flow_sigmas(4), noise_level=0.5)
    out = sde.step(torch.tensor([[-1.0]]), 3, torch.tensor([[2.0]]), noise=torch.zeros(1, 1))
    torch.testing.assert_close(out.mean, torch.tensor([[2.1979167]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(out.std, torch.tensor([0.1443376]), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- DanceGRPO step: hand-computed


def test_dance_sde_step_by_hand():
    # sigmas [1, .75, .5, .25, 0], eta = 0.3, step 1: s = 0.75, s_next = 0.5, dt = -0.25. The
    # expected mean is computed the way DanceGRPO's flux_step does, in plain floats:
    # x0_hat = x - s v = [1 - 1.5, -2 - 0.375] = [-0.5, -2.375];
    # score = -(x - (1 - s) x0_hat) / s^2 = [-1.125, 1.40625] / 0.5625 = [-2.0, 2.5];
    # mean = x + v dt - eta^2 / 2 * score * dt = [0.5 - 0.0225, -2.125 + 0.028125].
    s, s_next, eta = 0.75, 0.5, 0.3
    dt = s_next - s
    x, v = [1.0, -2.0], [2.0, 0.5]
    expected_mean = []
    for xi, vi in zip(x, v, strict=True):
        x0_hat = xi - s * vi
        score = -(xi - x0_hat * (1 - s)) / s**2
        expected_mean.append(xi + vi * dt - 0.5 * eta**2 * score * dt)
    assert expected_mean == pytest.approx([0.4775, -2.096875], abs=1e-12)
    expected_std = eta * math.sqrt(-dt)  # 0.3 * 0.5 = 0.15
    # z = +-1 per element: log N = -0.5 - log 0.15 - 0.9189385 = -0.5 + 1.8971200 - 0.9189385.
    expected_log_prob = -0.5 - math.log(expected_std) - HALF_LOG_TWO_PI
    assert expected_log_prob == pytest.approx(0.4781815, abs=1e-6)

    noise = torch.tensor([[1.0, -1.0]])
    out = DanceSDESampler(flow_sigmas(4), noise_level=0.3).step(
        torch.tensor([v]), 1, torch.tensor([x]), noise=noise
    )
    torch.testing.assert_close(out.mean, torch.tensor([expected_mean]), rtol=0, atol=1e-6)
    torch.testing.assert_close(out.std, torch.tensor([expected_std]), rtol=0, atol=1e-6)
    torch.testing.assert_close(out.prev_sample, out.mean + expected_std * noise)
    assert out.log_prob.item() == pytest.approx(expected_log_prob, abs=1e-5)
    summed = DanceSDESampler(flow_sigmas(4), 0.3, "sum").step(
        torch.tensor([v]), 1, torch.tensor([x]), noise=noise
    )
    assert summed.log_prob.item() == pytest.approx(2 * expected_log_prob, abs=1e-5)

    # Step 0 (s = 1) needs no special case: the (1 - s) v term vanishes and eta stays finite.
    # x coefficient 1 + 0.09 / 2 * (-0.25) = 0.98875; mean = 0.98875 * 1 + 2 * (-0.25) = 0.48875.
    first = DanceSDESampler(flow_sigmas(4), noise_level=0.3).step(
        torch.tensor([[2.0]]), 0, torch.tensor([[1.0]]), noise=torch.zeros(1, 1)
    )
    torch.testing.assert_close(first.mean, torch.tensor([[0.48875]]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_dance_sde_equals_flow_sde_where_the_diffusion_coefficients_agree(shift):
    # Both are Euler-Maruyama steps of one SDE; only the diffusion coefficient differs. Where
    # Flow-GRPO's a * sqrt(s / (1 - s)) equals DanceGRPO's constant eta, the steps are identical.
    sigmas = flow_sigmas(6, shift)
    flow = FlowSDESampler(sigmas, noise_level=0.7)
    diffusion = flow.diffusion_coefficient(sigmas[:-1])
    gen = torch.Generator().manual_seed(7)
    x, v, noise = (torch.randn(2, 3, 4, generator=gen) for _ in range(3))
    for i in range(flow.num_steps):  # includes s = 1, where Flow-GRPO uses sigmas[1] in 1 - s
        dance = DanceSDESampler(sigmas, noise_level=float(diffusion[i]))
        expected, got = flow.step(v, i, x, noise=noise), dance.step(v, i, x, noise=noise)
        for field in ("prev_sample", "log_prob", "mean", "std"):
            assert torch.equal(getattr(got, field), getattr(expected, field))
    # At s = 1/2, sqrt(s / (1 - s)) = 1, so eta = a: the hand-computed Flow-GRPO mean -0.49 above.
    half = DanceSDESampler(torch.tensor([1.0, 0.5, 0.0]), noise_level=0.7)
    mean = half.step(torch.full((1, 2), 2.0), 1, torch.ones(1, 2)).mean
    torch.testing.assert_close(mean, torch.full((1, 2), -0.49), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- CPS step: hand-computed


def test_cps_step_by_hand():
    # sigmas [1, .75, .5, .25, 0], a = 0.5, step 1: s = 0.75, s_next = 0.5.
    # x0_hat = x - s v = [-0.5, -2.375]; eps_hat = x + (1 - s) v = [1.5, -1.875];
    # std = 0.5 * sin(pi / 4) = 0.3535534; sqrt(s_next^2 - std^2) = sqrt(0.125) = 0.3535534;
    # mean = 0.5 * x0_hat + 0.3535534 * eps_hat = [-0.25 + 0.5303301, -1.1875 - 0.6629126].
    s, s_next, a = 0.75, 0.5, 0.5
    x, v = [1.0, -2.0], [2.0, 0.5]
    expected_std = s_next * math.sin(a * math.pi / 2)
    eps_weight = math.sqrt(s_next**2 - expected_std**2)
    expected_mean = [
        (xi - s * vi) * (1 - s_next) + (xi + (1 - s) * vi) * eps_weight
        for xi, vi in zip(x, v, strict=True)
    ]
    assert expected_mean == pytest.approx([0.2803301, -1.8504126], abs=1e-6)
    assert expected_std == pytest.approx(0.3535534, abs=1e-6)
    # z = +-1: log N = -0.5 - log 0.3535534 - 0.9189385 = -0.5 + 1.0397208 - 0.9189385.
    expected_log_prob = -0.5 - math.log(expected_std) - HALF_LOG_TWO_PI
    assert expected_log_prob == pytest.approx(-0.3792177, abs=1e-6)

    noise = torch.tensor([[1.0, -1.0]])
    for reduction, elements in (("mean", 1), ("sum", 2)):
        cps = FlowCPSSampler(flow_sigmas(4), noise_level=0.5, log_prob_reduction=reduction)
        out = cps.step(torch.tensor([v]), 1, torch.tensor([x]), noise=noise)
        torch.testing.assert_close(out.mean, torch.tensor([expected_mean]), rtol=0, atol=1e-6)
        torch.testing.assert_close(out.std, torch.tensor([expected_std]), rtol=0, atol=1e-6)
        torch.testing.assert_close(out.prev_sample, out.mean + expected_std * noise)
        assert out.log_prob.item() == pytest.approx(elements * expected_log_prob, abs=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cps_last_step_is_deterministic_with_zero_log_prob(reduction):
    # Step 3 of flow_sigmas(4): s = 0.25 -> s_next = 0, so std = 0 * sin(0.4 pi) = 0 and the mean
    # is x0_hat = x - 0.25 v = [1 - 0.5, -2 - 0.125] = [0.5, -2.125], whatever the noise.
    cps = FlowCPSSampler(flow_sigmas(4), noise_level=0.8, log_prob_reduction=reduction)
    x, v = torch.tensor([[1.0, -2.0]]), torch.tensor([[2.0, 0.5]])
    out = cps.step(v, 3, x, noise=torch.tensor([[5.0, -7.0]]))
    assert torch.equal(out.mean, torch.tensor([[0.5, -2.125]]))
    assert torch.equal(out.prev_sample, out.mean)
    assert torch.equal(out.std, torch.zeros(1)) and torch.equal(out.log_prob, torch.zeros(1))
    # No density to score: any given state gets exactly 0, never NaN.
    other = cps.step(v, 3, x, prev_sample=torch.tensor([[9.0, 9.0]]))
    assert torch.equal(other.log_prob, torch.zeros(1))
    assert cps.stochastic_steps.tolist() == [True, True, True, False]

    # Per-sample indices mixing the deterministic step with random ones (as training does).
    index = torch.tensor([3, 1, 3, 0])
    gen = torch.Generator().manual_seed(2)
    xs, vs = torch.randn(4, 2, 3, generator=gen), torch.randn(4, 2, 3, generator=gen)
    drawn = cps.step(vs, index, xs, generator=gen)
    v_param = vs.clone().requires_grad_(True)
    rescored = cps.step(v_param, index, xs, prev_sample=drawn.prev_sample)
    assert torch.equal(rescored.log_prob, drawn.log_prob)
    assert (rescored.log_prob == 0).tolist() == [True, False, True, False]
    moved = cps.step(vs, index, xs, prev_sample=drawn.prev_sample + 1)  # off the point mass too
    assert (moved.log_prob == 0).tolist() == [True, False, True, False]
    rescored.log_prob.sum().backward()
    assert torch.isfinite(v_param.grad).all()
    assert v_param.grad[[0, 2]].abs().sum() == 0 and v_param.grad[[1, 3]].abs().sum() > 0
    for b, i in enumerate(index.tolist()):
        single = cps.step(vs[b : b + 1], i, xs[b : b + 1], prev_sample=drawn.prev_sample[b : b + 1])
        assert torch.equal(single.log_prob, drawn.log_prob[b : b + 1])


def test_cps_draws_match_the_formulas_and_preserve_the_noise_coefficient():
    n = 40_000
    gen = torch.Generator().manual_seed(0)
    cps = FlowCPSSampler(flow_sigmas(4), noise_level=0.5)
    # Step 1 with x = 1, v = 2: mean 0.2803301 and std 0.3535534 (see test_cps_step_by_hand).
    s, s_next = 0.75, 0.5
    std = s_next * math.sin(math.pi / 4)
    mean = (1 - s * 2) * (1 - s_next) + (1 + (1 - s) * 2) * math.sqrt(s_next**2 - std**2)
    draws = cps.step(torch.full((1, n), 2.0), 1, torch.ones(1, n), generator=gen).prev_sample
    # Standard error of the mean is std / sqrt(n) = std / 200; allow 5 of them.
    assert abs(draws.mean().item() - mean) < 5 * std / 200
    assert draws.std().item() == pytest.approx(std, rel=0.02)

    # The paper's point: with the exact velocity v = eps - x0 of x_s = (1 - s) x0 + s eps, a step
    # lands on (1 - s_next) x0 + s_next * (unit Gaussian): over draws of eps and of the step's
    # noise, mean (1 - 0.5) * 2 = 1 and std exactly s_next = 0.5, for any a.
    x0 = 2.0
    eps = torch.randn(1, n, generator=gen)
    for a in (0.3, 1.0):
        step = FlowCPSSampler(flow_sigmas(4), noise_level=a).step
        x_next = step(eps - x0, 1, (1 - s) * x0 + s * eps, generator=gen).prev_sample
        assert abs(x_next.mean().item() - (1 - s_next) * x0) < 5 * s_next / 200
        assert x_next.std().item() == pytest.approx(s_next, rel=0.02)


# ---------------------------------------------------------------- every Gaussian sampler


def test_flow_grpo_wan_linear_sde_by_hand():
    # sigmas [1, 0.5, 0]: sigma_max = sigmas[1] = 0.5, sigma_min = sigmas[-1] = 0, so
    # g(s) = 0.5 s. x = 1, v = 2.
    # Step 0: s = 1, dt = -0.5, g = 0.5, g^2 / (2s) = 0.125:
    #   x coef 1 + 0.125 * (-0.5) = 0.9375; v coef (1 + 0.125 * 0) * (-0.5) = -0.5;
    #   mean = 0.9375 - 1 = -0.0625; std = 0.5 * sqrt(0.5) = 0.3535534.
    # Step 1: s = 0.5, g = 0.25, g^2 / (2s) = 0.0625:
    #   x coef 1 - 0.03125 = 0.96875; v coef (1 + 0.0625 * 0.5) * (-0.5) = -0.515625;
    #   mean = 0.96875 - 1.03125 = -0.0625; std = 0.25 * sqrt(0.5) = 0.1767767.
    sde = FlowSDELinearSampler(torch.tensor([1.0, 0.5, 0.0]))
    x, v = torch.ones(1, 2), torch.full((1, 2), 2.0)
    for step, std in ((0, 0.3535534), (1, 0.1767767)):
        out = sde.step(v, step, x, noise=torch.tensor([[1.0, -1.0]]))
        torch.testing.assert_close(out.mean, torch.full((1, 2), -0.0625), rtol=0, atol=1e-6)
        torch.testing.assert_close(out.std, torch.tensor([std]), rtol=0, atol=1e-6)
        # Each element is one std from the mean: log N = -0.5 - log(std) - log(sqrt(2 pi)).
        expected = -0.5 - math.log(std) - HALF_LOG_TWO_PI
        torch.testing.assert_close(out.log_prob, torch.tensor([expected]), rtol=0, atol=1e-5)
    # noise_level scales g: at 2.0 the std doubles; at 0 the step is Euler's.
    doubled = FlowSDELinearSampler(torch.tensor([1.0, 0.5, 0.0]), noise_level=2.0)
    torch.testing.assert_close(doubled.step(v, 1, x).std, torch.tensor([0.3535534]))
    still = FlowSDELinearSampler(torch.tensor([1.0, 0.5, 0.0]), noise_level=0.0)
    torch.testing.assert_close(still.step(v, 1, x).prev_sample, x - 0.5 * v)
