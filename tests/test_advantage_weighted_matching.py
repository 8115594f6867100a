"""AWM's advantage-weighted matching loss, its advantages and its noise levels, by hand on
small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from genrl.objectives.advantage_weighted_matching import (
    AdvantageWeightedMatchingLoss,
    AWMObjective,
    AWMObjectiveConfig,
    stratified_level_indices,
)


def _two_units() -> dict[str, torch.Tensor]:
    """Two units of two dims.

    unit 0: u = (1, 1), v = (0, 1): e = (1 + 0) / 2 = 0.5; A = 1, t = 0.5
    unit 1: u = (0, 2), v = (0, 0): e = (0 + 4) / 2 = 2.0; A = -0.5, t = 0.8
    """
    return {
        "u": torch.tensor([[1.0, 1.0], [0.0, 2.0]]),
        "v": torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        "A": torch.tensor([1.0, -0.5]),
        "t": torch.tensor([0.5, 0.8]),
    }


def test_t_weighted_loss_and_gradient_by_hand() -> None:
    d = _two_units()
    velocity = d["v"].clone().requires_grad_(True)
    loss, metrics = AdvantageWeightedMatchingLoss(weighting="t")(velocity, d["u"], d["A"], d["t"])
    # mean over units of A t e: (1 * 0.5 * 0.5 + (-0.5) * 0.8 * 2.0) / 2 = (0.25 - 0.8) / 2
    assert loss.item() == pytest.approx(-0.275, abs=1e-6)
    assert metrics["flow_matching_error"].item() == pytest.approx(1.25, abs=1e-6)
    loss.backward()
    assert velocity.grad is not None
    # d e / d v = -(u - v) (mean over 2 dims of the square), times A t / 2 units
    expected = torch.tensor([[-1 * 1.0 * 0.5 / 2, 0.0], [0.0, -2 * -0.5 * 0.8 / 2]])
    assert torch.allclose(velocity.grad, expected, atol=1e-6)


def test_generalised_huber_loss_and_gradient_by_hand() -> None:
    d = _two_units()
    p, offset = 0.25, 1e-10
    velocity = d["v"].clone().requires_grad_(True)
    loss, metrics = AdvantageWeightedMatchingLoss(weighting="ghuber", power=p)(
        velocity, d["u"], d["A"], d["t"]
    )
    g0 = 0.5 * ((0.5 + offset) ** p - offset**p) / p
    g1 = 0.8 * ((2.0 + offset) ** p - offset**p) / p
    assert g0 == pytest.approx(1.6755, abs=1e-4)  # 2 * (0.8409 - 0.0032)
    assert loss.item() == pytest.approx((1.0 * g0 - 0.5 * g1) / 2, abs=1e-6)
    assert metrics["weighted_error"].item() == pytest.approx((g0 + g1) / 2, abs=1e-6)
    loss.backward()
    assert velocity.grad is not None
    # d g / d e = t (e + offset)^(p - 1); d e / d v = -(u - v)
    slope0 = 0.5 * 0.5 ** (p - 1)
    slope1 = 0.8 * 2.0 ** (p - 1)
    expected = torch.tensor([[-1.0 * slope0 * 1.0 / 2, 0.0], [0.0, -0.5 * slope1 * -2.0 / 2]])
    assert torch.allclose(velocity.grad, expected, atol=1e-6)


def test_the_gradient_is_the_released_on_policy_ratio_form() -> None:
    """The released code trains ``mean(-A exp(log p - stopgrad(log p)))`` with
    ``log p = -g``: written here independently, its autograd gradient equals ours."""
    gen = torch.Generator().manual_seed(0)
    units, dims = 5, 7
    target = torch.randn(units, dims, generator=gen)
    advantages = torch.randn(units, generator=gen)
    times = torch.rand(units, generator=gen)
    velocity = torch.randn(units, dims, generator=gen, requires_grad=True)
    loss, _ = AdvantageWeightedMatchingLoss()(velocity, target, advantages, times)
    (ours,) = torch.autograd.grad(loss, velocity)
    v = velocity.detach().double().requires_grad_(True)
    error = ((v - target.double()) ** 2).mean(-1)
    log_prob = -times.double() * ((error + 1e-10) ** 0.25 - 1e-10**0.25) / 0.25
    ratio = torch.exp(log_prob - log_prob.detach())
    released = (-advantages.double() * ratio).mean()
    assert released.item() == pytest.approx(-advantages.mean().item(), abs=1e-6)
    (theirs,) = torch.autograd.grad(released, v)
    assert torch.allclose(ours.double(), theirs, atol=1e-6)


def test_the_two_kl_terms_by_hand() -> None:
    d = _two_units()
    reference = torch.tensor([[1.0, 1.0], [0.0, 1.0]])  # (v - v_ref)^2 means: 0.5, 0.5
    lagged = torch.tensor([[0.0, 3.0], [0.0, 0.0]])  # 2.0, 0.0
    velocity = d["v"].clone().requires_grad_(True)
    fn = AdvantageWeightedMatchingLoss(weighting="t", beta=0.1, lagged_beta=2.0)
    loss, metrics = fn(velocity, d["u"], d["A"], d["t"], reference, lagged)
    assert metrics["kl"].item() == pytest.approx(0.5, abs=1e-6)
    assert metrics["lagged_kl"].item() == pytest.approx(1.0, abs=1e-6)
    assert loss.item() == pytest.approx(-0.275 + 0.1 * 0.5 + 2.0 * 1.0, abs=1e-6)
    # A weight of 0 drops its term (and its metric) even with a velocity given.
    loss0, metrics0 = AdvantageWeightedMatchingLoss(weighting="t")(
        velocity, d["u"], d["A"], d["t"], reference, lagged
    )
    assert loss0.item() == pytest.approx(-0.275, abs=1e-6) and "kl" not in metrics0


def test_zero_advantages_and_an_exact_fit_give_finite_zero_policy_gradients() -> None:
    """Edge cases: a flat group (all advantages 0) trains only the KL; a unit the model fits
    exactly (e = 0, where ``e^(p - 1)`` is infinite) gets a zero, not a NaN, gradient, thanks
    to the released code's offset inside the power."""
    d = _two_units()
    velocity = d["v"].clone().requires_grad_(True)
    loss, _ = AdvantageWeightedMatchingLoss()(velocity, d["u"], torch.zeros(2), d["t"])
    loss.backward()
    assert loss.item() == 0.0 and velocity.grad is not None and not velocity.grad.any()
    exact = d["u"].clone().requires_grad_(True)
    loss, metrics = AdvantageWeightedMatchingLoss()(exact, d["u"], d["A"], d["t"])
    loss.backward()
    assert exact.grad is not None and torch.isfinite(exact.grad).all() and not exact.grad.any()
    assert loss.item() == 0.0 and metrics["flow_matching_error"].item() == 0.0


def test_advantages_are_normalised_clipped_and_scaled() -> None:
    objective = AWMObjective(AWMObjectiveConfig(), rollout=None, group_size=2)
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0])
    advantages = objective.advantages(rewards, ["a", "a", "b", "b"], torch.tensor([0, 0, 1, 1]))
    # per-prompt means 1.5 and 3.5, global (population) std sqrt(1.25); then / 5 * 1
    a = 0.5 / (math.sqrt(1.25) + 1e-4) / 5
    assert torch.allclose(advantages, torch.tensor([-a, a, -a, a]), atol=1e-6)
    clipped = AWMObjective(
        AWMObjectiveConfig(std_mode="none", advantage_clip=2.0, advantage_max=1.0),
        rollout=None,
        group_size=2,
    )
    out = clipped.advantages(torch.tensor([0.0, 10.0]), ["a", "a"], torch.tensor([0, 0]))
    assert out.tolist() == [-1.0, 1.0]  # (r - 5) clipped to +-2, then / 2


def test_stratified_levels_follow_the_released_boundaries() -> None:
    # 14 steps, fraction 0.9: strata from linspace(1, 12, 7) truncated: 1, 2, 4, 6, 8, 10, 12
    low = stratified_level_indices(torch.zeros(1, 6), 14, 0.9, skip_first=True)
    high = stratified_level_indices(torch.full((1, 6), 0.99), 14, 0.9, skip_first=True)
    assert low.tolist() == [[1, 2, 4, 6, 8, 10]]
    assert high.tolist() == [[1, 3, 5, 7, 9, 11]]
    # PickScore's "discrete": linspace(0, 12, 7) = 0, 2, .., 12
    mid = stratified_level_indices(torch.full((2, 6), 0.5), 14, 0.9, skip_first=False)
    assert mid.tolist() == [[1, 3, 5, 7, 9, 11]] * 2
