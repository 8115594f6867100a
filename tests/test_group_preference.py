"""DGPO's group preference loss and advantages, by hand on small tensors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from genrl.objectives.group_preference import (
    DGPOObjective,
    DGPOObjectiveConfig,
    GroupPreferenceLoss,
)


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _softplus(x: float) -> float:
    return math.log(1 + math.exp(x))


def _two_groups() -> dict[str, torch.Tensor]:
    """Two groups of two members, two dims each. Group 0 has advantages (1, -1); group 1's
    rewards were all equal, so its advantages are 0.

    group 0: member 0: u = (1, 1), v = (0, 1), v_ref = (1, 1): e = 0.5, e_ref = 0
             member 1: u = (0, 2), v = (0, 0), v_ref = (0, 1): e = 2.0, e_ref = 0.5
    group 1: u = (1, 0) and (0, 1), v = 0, v_ref = (1, 1): e = 0.5 each.
    """
    target = torch.tensor([[[1.0, 1.0], [0.0, 2.0]], [[1.0, 0.0], [0.0, 1.0]]])
    velocity = torch.tensor([[[0.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]])
    reference = torch.tensor([[[1.0, 1.0], [0.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]]])
    advantages = torch.tensor([[1.0, -1.0], [0.0, 0.0]])
    return {"v": velocity, "ref": reference, "u": target, "A": advantages}


def test_the_loss_and_its_gradient_by_hand() -> None:
    d = _two_groups()
    velocity = d["v"].clone().requires_grad_(True)
    loss, metrics = GroupPreferenceLoss(beta=2.0)(velocity, d["ref"], d["u"], d["A"])
    # group 0: s = beta / k * sum A (e - e_ref) = 2 / 2 * (1 * 0.5 - 1 * 1.5) = -1
    w0 = _sigmoid(-1.0)
    # surrogate: mean over the 4 members of w_g A_i e_i; group 1 adds 0 but counts
    expected = (w0 * (1 * 0.5 - 1 * 2.0) + 0.0) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["group_dpo_loss"].item() == pytest.approx(
        (_softplus(-1.0) + _softplus(0.0)) / 2, abs=1e-6
    )
    assert metrics["group_weight_mean"].item() == pytest.approx((w0 + 0.5) / 2, abs=1e-6)
    loss.backward()
    assert velocity.grad is not None
    # d e_i / d v_i = -(u_i - v_i) (mean over 2 dims of the square); times w A / 4
    expected_grad = torch.tensor([[[-w0 / 4, 0.0], [0.0, w0 * 2 / 4]], [[0.0, 0.0], [0.0, 0.0]]])
    assert torch.allclose(velocity.grad, expected_grad, atol=1e-6)


def test_the_gradient_is_the_group_dpo_gradient_over_beta() -> None:
    """Independently: autograd of mean_g softplus(beta / k sum_i A_i (e_i - e_ref,i)), on random
    tensors, equals beta times the surrogate's gradient."""
    gen = torch.Generator().manual_seed(0)
    units, k, dims, beta = 3, 4, 5, 7.0
    target = torch.randn(units, k, dims, generator=gen)
    reference = torch.randn(units, k, dims, generator=gen)
    advantages = torch.randn(units, k, generator=gen)
    velocity = torch.randn(units, k, dims, generator=gen, requires_grad=True)
    loss, _ = GroupPreferenceLoss(beta=beta)(velocity, reference, target, advantages)
    (surrogate_grad,) = torch.autograd.grad(loss, velocity)
    v = velocity.detach().clone().requires_grad_(True)
    error = ((target - v) ** 2).mean(-1)
    reference_error = ((target - reference) ** 2).mean(-1)
    margin = beta / k * (advantages * (error - reference_error)).sum(-1)
    (dpo_grad,) = torch.autograd.grad(F.softplus(margin).mean(), v)
    # the surrogate's 1 / (U k) mean against the DPO loss's 1 / U mean and its beta / k factor
    assert torch.allclose(beta * surrogate_grad, dpo_grad, atol=1e-5)


def test_the_kl_and_the_clip_by_hand() -> None:
    d = _two_groups()
    # old velocity: member (0, 0) has e_old = ((1-1)^2 + (1+1)^2) / 2 = 2, so ratio =
    # exp(2 - 0.5) > 1.01 with A > 0: clipped. Every other member's old velocity is its current
    # one (ratio 1: kept).
    old = d["v"].clone()
    old[0, 0] = torch.tensor([1.0, -1.0])
    velocity = d["v"].clone().requires_grad_(True)
    fn = GroupPreferenceLoss(beta=2.0, kl_beta=0.1, clip_range=0.01)
    loss, metrics = fn(velocity, d["ref"], d["u"], d["A"], old_velocity=old, kl_velocity=d["ref"])
    w0 = _sigmoid(-1.0)
    # KL to v_ref per member: 0.5, 0.5, 1, 1 -> mean 0.75; the clip changes gradients only
    assert loss.item() == pytest.approx(w0 * -1.5 / 4 + 0.1 * 0.75, abs=1e-6)
    assert metrics["kl"].item() == pytest.approx(0.75, abs=1e-6)
    assert metrics["clip_fraction"].item() == pytest.approx(0.25)
    loss.backward()
    assert velocity.grad is not None
    # member (0, 0): only the KL's gradient, 0.1 * 2 (v - v_ref) / 2 / 4 members
    assert torch.allclose(velocity.grad[0, 0], torch.tensor([-0.1 / 4, 0.0]), atol=1e-6)
    # member (0, 1): the policy term w0 * 2 / 4 on dim 1, plus the KL's 0.1 * (0 - 1) / 4
    assert torch.allclose(velocity.grad[0, 1], torch.tensor([0.0, w0 * 2 / 4 - 0.1 / 4]), atol=1e-6)
    # the flat group: only the KL, 0.1 * (0 - 1) / 4 in each dim
    assert torch.allclose(velocity.grad[1], torch.full((2, 2), -0.1 / 4), atol=1e-6)


def test_a_group_of_equal_rewards_gets_zero_advantages_and_no_policy_gradient() -> None:
    """The reference's per-prompt ``(r - mean) / (std + 1e-4)``: a flat group's advantages are 0,
    and the group stays in the loss's mean with weight sigmoid(0) but no gradient."""
    objective = DGPOObjective(DGPOObjectiveConfig(), rollout=None, group_size=2)
    rewards = torch.tensor([1.0, 1.0, 0.0, 2.0])
    advantages = objective.advantages(rewards, ["a", "a", "b", "b"], torch.tensor([0, 0, 1, 1]))
    # global std (population) of (1, 1, 0, 2): sqrt(2 / 4)
    scale = 1 / (math.sqrt(0.5) + 1e-4)
    assert torch.allclose(advantages, torch.tensor([0.0, 0.0, -scale, scale]), atol=1e-5)
    d = _two_groups()
    velocity = d["v"].clone().requires_grad_(True)
    flat = torch.zeros(1, 2)
    loss, metrics = GroupPreferenceLoss(beta=2.0)(velocity[1:], d["ref"][1:], d["u"][1:], flat)
    loss.backward()
    assert loss.item() == 0.0 and metrics["group_weight_mean"].item() == pytest.approx(0.5)
    assert velocity.grad is not None and not velocity.grad.any()


def test_advantages_are_clipped_and_levels_are_the_noisiest() -> None:
    config = DGPOObjectiveConfig(std_mode="none", advantage_clip=5.0, sampler_levels=3)
    sigmas = torch.linspace(1.0, 0.0, 11)  # a 10-step sampler
    rollout = SimpleNamespace(ode=SimpleNamespace(sigmas=sigmas))
    objective = DGPOObjective(config, rollout=rollout, group_size=2)
    advantages = objective.advantages(torch.tensor([0.0, 20.0]), ["a", "a"], torch.tensor([0, 0]))
    assert advantages.tolist() == [-5.0, 5.0]  # (r - 10) without a std, clipped to 5
    assert torch.equal(objective.sampler_levels(), sigmas[:3])
    config.sampler_levels = None
    assert torch.equal(objective.sampler_levels(), sigmas[:-1])
