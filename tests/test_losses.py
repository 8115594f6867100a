"""Tests of the clipped surrogate and the KL terms on hand-computed examples."""

from __future__ import annotations

import math

import pytest
import torch

from genrl.objectives.losses import ClippedSurrogate, gaussian_mean_kl, token_kl

# Five elements, clip range 0.2 (ratio kept in [0.8, 1.2]):
#   ratio  A    -A*ratio  -A*clip(ratio)  max     clipped term active?  d loss / d logp (x N)
#   1.1    2    -2.2      -2.2            -2.2    no                    -A*ratio = -2.2
#   1.5    1    -1.5      -1.2            -1.2    yes                   0
#   1.5   -1     1.5       1.2             1.5    no                    -A*ratio = 1.5
#   0.5   -1     0.5       0.8             0.8    yes                   0
#   0.5    1    -0.5      -0.8            -0.5    no                    -A*ratio = -0.5
# loss = (-2.2 - 1.2 + 1.5 + 0.8 - 0.5) / 5 = -1.6 / 5 = -0.32; clip_fraction 2/5.
RATIOS = [1.1, 1.5, 1.5, 0.5, 0.5]
ADVANTAGES = torch.tensor([2.0, 1.0, -1.0, -1.0, 1.0])
OLD = torch.tensor([-1.0, 0.3, -2.0, 0.7, 0.0])


def _log_probs(old, ratios):
    return (old + torch.tensor([math.log(r) for r in ratios])).requires_grad_(True)


def test_clipped_surrogate_by_hand():
    log_probs = _log_probs(OLD, RATIOS)
    loss, metrics = ClippedSurrogate(0.2)(log_probs, OLD, ADVANTAGES)
    assert loss.ndim == 0
    assert loss.item() == pytest.approx(-0.32, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(0.4)
    # ratio mean (1.1 + 1.5 + 1.5 + 0.5 + 0.5) / 5 = 1.02.
    assert metrics["ratio_mean"] == pytest.approx(1.02, abs=1e-6)
    assert metrics["ratio_min"] == pytest.approx(0.5, abs=1e-6)
    assert metrics["ratio_max"] == pytest.approx(1.5, abs=1e-6)
    # approx_kl = 0.5 * mean(d^2), d = log ratio:
    # (0.0953102^2 + 2 * 0.4054651^2 + 2 * 0.6931472^2) / 5 / 2
    # = (0.0090840 + 0.3288039 + 0.9609060) / 10 = 0.1298794.
    assert metrics["approx_kl"] == pytest.approx(0.1298794, abs=1e-6)
    # Metrics are detached 0-dim tensors (read back once per iteration by the trainer).
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())


def test_clipped_surrogate_gradient():
    log_probs = _log_probs(OLD, RATIOS)
    old = OLD.clone().requires_grad_(True)
    loss, _ = ClippedSurrogate(0.2)(log_probs, old, ADVANTAGES)
    loss.backward()
    # d/dlogp of -A*ratio is -A*ratio; divided by N = 5: [-0.44, 0, 0.3, 0, -0.1].
    expected = torch.tensor([-2.2 / 5, 0.0, 1.5 / 5, 0.0, -0.5 / 5])
    torch.testing.assert_close(log_probs.grad, expected, rtol=1e-6, atol=1e-7)
    # The rollout log-probs are constants of the objective.
    assert old.grad is None


def test_clipped_surrogate_inside_range_is_plain_policy_gradient():
    # Ratios within [0.8, 1.2]: loss = -mean(A * ratio) = -(0.5 * 0.9 + (-2) * 1.15) / 2
    # = -(0.45 - 2.3) / 2 = 0.925; nothing clipped.
    log_probs = _log_probs(torch.zeros(2), [0.9, 1.15])
    loss, metrics = ClippedSurrogate(0.2)(log_probs, torch.zeros(2), torch.tensor([0.5, -2.0]))
    assert loss.item() == pytest.approx(0.925, abs=1e-6)
    assert metrics["clip_fraction"] == 0.0
    loss.backward()
    # Gradient -A*ratio/N: [-0.45 / 2, 2.3 / 2].
    torch.testing.assert_close(log_probs.grad, torch.tensor([-0.225, 1.15]))


def test_clipped_surrogate_asymmetric_ranges():
    # DAPO clip-higher: low 0.2, high 0.28 -> ratio kept in [0.8, 1.28].
    #   ratio 1.25, A 1:  -1.25 vs -1.25 -> -1.25 (inside the high range; with 0.2 it would be -1.2)
    #   ratio 1.3,  A 1:  -1.3 vs -1.28 -> -1.28 (clipped)
    #   ratio 0.75, A -1: 0.75 vs 0.8 -> 0.8 (clipped at the low side)
    # loss = (-1.25 - 1.28 + 0.8) / 3 = -1.73 / 3 = -0.5766667; clip_fraction 2/3.
    loss_fn = ClippedSurrogate(0.2, 0.28)
    assert loss_fn.clip_range_high == 0.28
    log_probs = _log_probs(torch.zeros(3), [1.25, 1.3, 0.75])
    loss, metrics = loss_fn(log_probs, torch.zeros(3), torch.tensor([1.0, 1.0, -1.0]))
    assert loss.item() == pytest.approx(-1.73 / 3, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(2 / 3)
    loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([-1.25 / 3, 0.0, 0.0]))
    # Symmetric 0.2 clips the first element too: (-1.2 - 1.2 + 0.8) / 3 = -1.6 / 3.
    sym, sym_metrics = ClippedSurrogate(0.2)(
        _log_probs(torch.zeros(3), [1.25, 1.3, 0.75]),
        torch.zeros(3),
        torch.tensor([1.0, 1.0, -1.0]),
    )
    assert sym.item() == pytest.approx(-1.6 / 3, abs=1e-6)
    assert sym_metrics["clip_fraction"] == 1.0


def test_ratio_exactly_one_when_log_probs_equal():
    log_probs = torch.tensor([-3.7, 0.2, 1.9, -0.4], requires_grad=True)
    advantages = torch.tensor([1.0, -2.0, 0.5, 3.0])
    loss, metrics = ClippedSurrogate(1e-4)(log_probs, log_probs.detach().clone(), advantages)
    # ratio = exp(0) = 1 exactly: loss = -mean(A) = -(1 - 2 + 0.5 + 3) / 4 = -0.625.
    assert loss.item() == -0.625
    assert metrics["ratio_mean"] == metrics["ratio_min"] == metrics["ratio_max"] == 1.0
    assert metrics["clip_fraction"] == 0.0
    assert metrics["approx_kl"] == 0.0
    loss.backward()
    torch.testing.assert_close(log_probs.grad, -advantages / 4)


def test_clipped_surrogate_errors():
    with pytest.raises(ValueError, match="share one shape"):
        ClippedSurrogate(0.2)(torch.zeros(3), torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="share one shape"):
        ClippedSurrogate(0.2)(torch.zeros(3, 1), torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="positive"):
        ClippedSurrogate(0.0)
    with pytest.raises(ValueError, match="positive"):
        ClippedSurrogate(0.2, -0.1)


# ---------------------------------------------------------------- KL terms


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gaussian_mean_kl_matches_torch_kl_divergence(reduction):
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(3, 2, 4, generator=gen)
    ref_mean = torch.randn(3, 2, 4, generator=gen)
    std = torch.tensor([0.5, 1.0, 2.0])
    scale = std.reshape(3, 1, 1).expand_as(mean)
    expected = torch.distributions.kl_divergence(
        torch.distributions.Normal(mean, scale), torch.distributions.Normal(ref_mean, scale)
    )
    expected = expected.mean(dim=(1, 2)) if reduction == "mean" else expected.sum(dim=(1, 2))
    got = gaussian_mean_kl(mean, ref_mean, std, reduction)
    assert got.shape == (3,)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_gaussian_mean_kl_by_hand():
    # Differences [1, 3] with std 2: d^2 / (2 * 4) = [0.125, 1.125]; mean 0.625, sum 1.25.
    mean = torch.tensor([[1.0, 3.0]])
    ref = torch.zeros(1, 2)
    std = torch.tensor([2.0])
    assert gaussian_mean_kl(mean, ref, std).item() == pytest.approx(0.625)
    assert gaussian_mean_kl(mean, ref, std, "sum").item() == pytest.approx(1.25)
    assert gaussian_mean_kl(ref, ref, std).item() == 0.0


def test_token_kl_by_hand():
    # d = ref - logp = [0, 1, -1].
    log_probs = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.0, -1.0, -1.5])
    # k1 = -d = [0, -1, 1]; k2 = d^2 / 2 = [0, 0.5, 0.5];
    # k3 = exp(d) - d - 1 = [0, e - 2, 1/e] = [0, 0.7182818, 0.3678794].
    torch.testing.assert_close(token_kl(log_probs, ref, "k1"), torch.tensor([0.0, -1.0, 1.0]))
    torch.testing.assert_close(token_kl(log_probs, ref, "k2"), torch.tensor([0.0, 0.5, 0.5]))
    torch.testing.assert_close(
        token_kl(log_probs, ref, "k3"), torch.tensor([0.0, 0.7182818, 0.3678794])
    )
    torch.testing.assert_close(token_kl(log_probs, ref), token_kl(log_probs, ref, "k3"))
    with pytest.raises(ValueError, match="k1, k2, k3"):
        token_kl(log_probs, ref, "k4")


def test_token_kl_k3_is_non_negative():
    gen = torch.Generator().manual_seed(0)
    log_probs = 3 * torch.randn(1000, generator=gen)
    ref = 3 * torch.randn(1000, generator=gen)
    assert (token_kl(log_probs, ref, "k3") >= 0).all()
    assert (token_kl(log_probs, ref, "k2") >= 0).all()


def test_gaussian_mean_kl_rejects_unknown_reduction():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="reduction"):
        gaussian_mean_kl(x, x, torch.ones(2), "mena")


# ------------------------------------------------------ log-ratio clamp and dual clip


def test_large_log_ratios_stay_finite() -> None:
    """Issue 13: without a clamp, A = +1 at log-ratio 100 gave a NaN gradient (exp overflows, the
    unclipped branch's infinity times the mask's 0) and A = -1 at log-ratio 30 a loss of 5e12."""
    log_probs = torch.tensor([100.0], requires_grad=True)
    loss, _ = ClippedSurrogate(0.2)(log_probs, torch.zeros(1), torch.tensor([1.0]))
    loss.backward()
    assert loss.item() == pytest.approx(-1.2)  # the clipped term, exp(20) is finite
    assert log_probs.grad is not None and torch.isfinite(log_probs.grad).all()
    raw = torch.tensor([100.0], requires_grad=True)
    unclamped, _ = ClippedSurrogate(0.2, log_ratio_clamp=None)(raw, torch.zeros(1), torch.ones(1))
    unclamped.backward()
    assert raw.grad is not None and torch.isnan(raw.grad).all()  # what the clamp prevents
    # A = -1, log-ratio 30: clamped to exp(20) = 4.85e8; the dual clip bounds it by -A c = 3.
    big, _ = ClippedSurrogate(0.2)(torch.tensor([30.0]), torch.zeros(1), torch.tensor([-1.0]))
    assert big.item() == pytest.approx(math.exp(20), rel=1e-6)
    bounded, metrics = ClippedSurrogate(0.2, clip_ratio_c=3.0)(
        torch.tensor([30.0]), torch.zeros(1), torch.tensor([-1.0])
    )
    assert bounded.item() == pytest.approx(3.0)
    assert metrics["dual_clip_fraction"] == 1.0


def test_dual_clip_by_hand() -> None:
    """verl's ``compute_policy_loss_vanilla`` (clip_ratio_c = 3): for A < 0 the loss is
    ``min(max(-A r, -A clip(r)), -A c)``.

        ratio  A     PPO term          dual bound  loss
        1.1    2     -2.2               -          -2.2
        1.5    1     -1.2 (clipped)     -          -1.2
        4.0   -1      4.0               3          3     (dual clip)
        4.0   -0.5    2.0               1.5        1.5   (dual clip)
    mean = (-2.2 - 1.2 + 3 + 1.5) / 4 = 0.275; only the first element has a gradient.
    """
    log_probs = _log_probs(torch.zeros(4), [1.1, 1.5, 4.0, 4.0])
    advantages = torch.tensor([2.0, 1.0, -1.0, -0.5])
    loss, metrics = ClippedSurrogate(0.2, clip_ratio_c=3.0)(log_probs, torch.zeros(4), advantages)
    assert loss.item() == pytest.approx(0.275, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(0.25)
    assert metrics["dual_clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(log_probs.grad, torch.tensor([-2.2 / 4, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ClippedSurrogate(0.2, clip_ratio_c=1.0)


def test_ppo_kl_is_the_mean_of_old_minus_new() -> None:
    """verl logs ``ppo_kl = mean(old - new)``; Flow-GRPO logs ``approx_kl = 0.5 mean(d^2)``."""
    log_probs = _log_probs(OLD, RATIOS)
    _, metrics = ClippedSurrogate(0.2)(log_probs, OLD, ADVANTAGES)
    # -(0.0953102 + 2 * 0.4054651 - 2 * 0.6931472) / 5 = 0.0960108.
    expected = -sum(math.log(r) for r in RATIOS) / 5
    assert metrics["ppo_kl"] == pytest.approx(expected, abs=1e-6)
    assert metrics["ppo_kl"] == pytest.approx(0.0960108, abs=1e-6)


def test_weights_scale_each_element_before_the_mean() -> None:
    # GRPO-Guard divides each transition's term by its step's |dt|: weights [2, 0.5].
    log_probs = _log_probs(torch.zeros(2), [0.9, 1.15])
    loss, _ = ClippedSurrogate(0.2)(
        log_probs, torch.zeros(2), torch.tensor([0.5, -2.0]), torch.tensor([2.0, 0.5])
    )
    # (-0.45 * 2 + 2.3 * 0.5) / 2 = 0.125.
    assert loss.item() == pytest.approx(0.125, abs=1e-6)
