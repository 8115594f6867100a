"""RAM, GDRO and DiffusionNFT losses against numbers worked out by hand, and their limits."""

from __future__ import annotations

import math

import pytest
import torch

from genrl.objectives.regression import sample_times
from genrl.objectives.regression_losses import GroupRankingLoss, NFTLoss, RAMLoss


# -- RAM -----------------------------------------------------------------------------------------
def test_ram_loss_by_hand() -> None:
    v = torch.tensor([[1.0, 2.0], [0.0, 1.0]], requires_grad=True)
    v_ref = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    v_corr = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    u = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    w = torch.tensor([0.5, -1.0])
    # target_0 = [0, 1] + 0.5 ([2, 0] - [1, 1]) = [0.5, 0.5]; v - target = [0.5, 1.5] -> 1.25
    # target_1 = [1, 1] - ([1, 1] - [0, 0]) = [0, 0];      v - target = [0, 1]     -> 0.5
    loss, metrics = RAMLoss()(v, v_ref, v_corr, u, w)
    assert loss.item() == pytest.approx((1.25 + 0.5) / 2)
    loss.backward()
    # d/dv of mean_units mean_dims (v - target)^2 = 2 (v - target) / (2 dims * 2 units)
    assert v.grad is not None
    assert torch.allclose(v.grad, torch.tensor([[0.25, 0.75], [0.0, 0.5]]))
    assert metrics["weight_abs_mean"] == pytest.approx(0.75)


def test_ram_time_weights_scale_each_unit() -> None:
    v = torch.tensor([[1.0], [2.0]])
    zeros = torch.zeros(2, 1)
    # errors (v - 0)^2 = [1, 4]; weights [3, 0.5] -> (3 + 2) / 2
    loss, _ = RAMLoss()(v, zeros, zeros, zeros, torch.zeros(2), torch.tensor([3.0, 0.5]))
    assert loss.item() == pytest.approx(2.5)


def test_ram_loss_uses_no_gradient_through_the_target() -> None:
    """With the correction being the current velocity (eq. 17), the target is still a constant:
    the gradient is 2 (v - target) / n, not (1 + w) times that."""
    v = torch.tensor([[1.0]], requires_grad=True)
    loss, _ = RAMLoss()(v, torch.zeros(1, 1), v, torch.tensor([[3.0]]), torch.tensor([2.0]))
    loss.backward()
    # target = 0 + 2 (3 - 1) = 4 -> gradient 2 (1 - 4) = -6
    assert v.grad is not None and v.grad.item() == pytest.approx(-6.0)


def test_ram_with_zero_reward_pulls_the_velocity_to_the_reference() -> None:
    torch.manual_seed(0)
    v = torch.randn(8, 3, requires_grad=True)
    v_ref, u = torch.randn(8, 3), torch.randn(8, 3)
    optimizer = torch.optim.SGD([v], lr=1.0)
    for _ in range(200):
        loss, _ = RAMLoss()(v, v_ref, v.detach(), u, torch.zeros(8))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert torch.allclose(v, v_ref, atol=1e-5)


def test_ram_fixed_point_mixes_reference_and_sample_velocity() -> None:
    """With the current velocity in the correction, the fixed point of the semi-gradient
    iteration solves ``v = v_ref + w (u - v)``, i.e. ``v = (v_ref + w u) / (1 + w)``."""
    v = torch.zeros(1, 2, requires_grad=True)
    v_ref, u, w = torch.tensor([[1.0, -1.0]]), torch.tensor([[3.0, 1.0]]), torch.tensor([0.5])
    optimizer = torch.optim.SGD([v], lr=0.5)
    for _ in range(300):
        loss, _ = RAMLoss()(v, v_ref, v.detach(), u, w)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert torch.allclose(v, (v_ref + 0.5 * u) / 1.5, atol=1e-5)


# -- GDRO ----------------------------------------------------------------------------------------
def _group(values: list[float]) -> torch.Tensor:
    return torch.tensor(values).view(1, len(values), 1)


def test_gdro_loss_by_hand() -> None:
    u = _group([1.0, 0.0, 2.0])
    v = _group([0.0, 0.5, 1.0]).requires_grad_(True)
    v_ref = _group([1.0, 1.0, 1.0])
    r = torch.tensor([[0.2, 0.9, 0.5]])
    # errors (u - v)^2 = [1, 0.25, 1], reference errors [0, 1, 1]
    # s = -beta (err - ref) with beta 2: [-2, 1.5, 0]
    # sorted by reward (0.9, 0.5, 0.2): s = [1.5, 0, -2]
    s, rs, tau, gamma = [1.5, 0.0, -2.0], [0.9, 0.5, 0.2], 0.5, 2.0

    def soft(values: list[float]) -> list[float]:
        e = [math.exp(x / tau) for x in values]
        return [x / sum(e) for x in e]

    expected = 0.0
    for i in range(2):
        lse = math.log(sum(math.exp(x) for x in s[i:]))
        expected += lse - sum(q * x for q, x in zip(soft(rs[i:]), s[i:], strict=True))
    expected += gamma * 0.25  # best sample (reward 0.9): (0 - 0.5)^2
    loss, metrics = GroupRankingLoss(beta=2.0, tau=tau, gamma=gamma)(v, v_ref, u, r)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["best_flow_matching"] == pytest.approx(0.25)
    assert metrics["ranking_accuracy"] == 1.0  # s sorted by reward is decreasing


def test_gdro_sum_reduction_scales_the_implicit_reward() -> None:
    u, v, v_ref = torch.ones(1, 2, 4), torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)
    v[0, 0] = 1.0  # member 0 fits its target exactly: err 0 vs ref err 1 (mean) / 4 (sum)
    r = torch.tensor([[1.0, 0.0]])
    mean_loss, _ = GroupRankingLoss(1.0, 0.0, 0.0, "mean")(v, v_ref, u, r)
    sum_loss, _ = GroupRankingLoss(1.0, 0.0, 0.0, "sum")(v, v_ref, u, r)
    # k = 2, tau = 0: -log sigmoid(s_1 - s_2) = log(1 + exp(-(s_1 - s_2)))
    assert mean_loss.item() == pytest.approx(math.log1p(math.exp(-1.0)), rel=1e-5)
    assert sum_loss.item() == pytest.approx(math.log1p(math.exp(-4.0)), rel=1e-5)


def test_gdro_pair_with_vanishing_temperature_is_diffusion_dpo() -> None:
    torch.manual_seed(0)
    u, v, v_ref = torch.randn(5, 2, 6), torch.randn(5, 2, 6), torch.randn(5, 2, 6)
    r = torch.tensor([[0.1, 0.7], [0.9, 0.2], [0.3, 0.4], [0.5, 0.0], [0.8, 0.6]])
    beta = 3.0
    win = r.argmax(1)
    idx = torch.arange(5)
    lose = 1 - win

    def err(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return ((u[idx, m] - x[idx, m]) ** 2).mean(1)

    margin = (err(v, win) - err(v_ref, win)) - (err(v, lose) - err(v_ref, lose))
    dpo = -torch.nn.functional.logsigmoid(-beta * margin).mean()
    hard, _ = GroupRankingLoss(beta, 0.0, 0.0)(v, v_ref, u, r)
    cold, _ = GroupRankingLoss(beta, 1e-4, 0.0)(v, v_ref, u, r)
    assert hard.item() == pytest.approx(dpo.item(), rel=1e-6)
    assert cold.item() == pytest.approx(dpo.item(), rel=1e-4)


def test_gdro_ties_share_the_target_continuously_in_tau() -> None:
    """Issue 13: with tau = 0 the whole target weight went to the first of tied members (index
    order), so the loss jumped between tau = 0 and tau = 1e-8 (5.86 vs 3.86 on issue's group).
    The limit tau -> 0 of softmax(r / tau) splits it equally among the tied best."""
    torch.manual_seed(1)
    u, v, v_ref = torch.randn(1, 3, 4), torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    r = torch.tensor([[0.7, 0.7, 0.1]])
    loss_fn = GroupRankingLoss(beta=6.0, tau=0.0, gamma=1.0)
    hard, _ = loss_fn(v, v_ref, u, r)
    cold, _ = GroupRankingLoss(beta=6.0, tau=1e-8, gamma=1.0)(v, v_ref, u, r)
    assert hard.item() == pytest.approx(cold.item(), rel=1e-6)
    # By hand: s = -beta (err - ref err); step 1 targets (1/2, 1/2, 0), step 2 (1, 0) after the
    # stable sort keeps [member 0, member 1, member 2]; the best term averages members 0 and 1.
    err = ((u - v) ** 2).mean(2)[0]
    ref = ((u - v_ref) ** 2).mean(2)[0]
    s = (-6.0 * (err - ref)).tolist()
    step1 = math.log(sum(math.exp(x) for x in s)) - (s[0] + s[1]) / 2
    step2 = math.log(math.exp(s[1]) + math.exp(s[2])) - s[1]
    expected = step1 + step2 + (float(err[0]) + float(err[1])) / 2
    assert hard.item() == pytest.approx(expected, rel=1e-5)


def test_gdro_depends_on_the_order_of_tied_members_as_eq_7_does() -> None:
    """Eq. 7 places tied members one after the other (stable sort: their order in the group),
    and a later stage sees only the later ones, so swapping two members tied for the best
    changes the loss; a tie at the bottom of three is seen whole by the last stage and is
    symmetric (docs/algorithms/gdro.md, "Tied rewards and order")."""
    torch.manual_seed(0)
    v, v_ref, u = torch.randn(1, 3, 4), torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    loss_fn = GroupRankingLoss(beta=1.0, tau=0.05, gamma=1.0)
    err = ((u - v) ** 2).mean(2)[0].tolist()
    s = (-1.0 * (((u - v) ** 2).mean(2) - ((u - v_ref) ** 2).mean(2)))[0].tolist()

    def by_hand(order: list[int], rewards: list[float]) -> float:
        """Eq. 7 over ``order`` (best first) plus the best-sample term (ties share it)."""
        total = 0.0
        for i in range(len(order) - 1):
            rest = order[i:]
            weights = [math.exp(rewards[j] / 0.05) for j in rest]
            target = sum(w * s[j] for w, j in zip(weights, rest, strict=True)) / sum(weights)
            total += math.log(sum(math.exp(s[j]) for j in rest)) - target
        best = [j for j in order if rewards[j] == max(rewards)]
        return total + sum(err[j] for j in best) / len(best)

    top_tie = [1.0, 1.0, 0.0]
    swap = torch.tensor([1, 0, 2])
    as_given, _ = loss_fn(v, v_ref, u, torch.tensor([top_tie]))
    swapped, _ = loss_fn(v[:, swap], v_ref[:, swap], u[:, swap], torch.tensor([top_tie]))
    assert as_given.item() == pytest.approx(by_hand([0, 1, 2], top_tie), rel=1e-5)
    assert swapped.item() == pytest.approx(by_hand([1, 0, 2], top_tie), rel=1e-5)
    assert abs(as_given.item() - swapped.item()) > 0.1  # 6.868 against 7.371
    bottom_tie = [1.0, 0.0, 0.0]
    swap = torch.tensor([0, 2, 1])
    as_given, _ = loss_fn(v, v_ref, u, torch.tensor([bottom_tie]))
    swapped, _ = loss_fn(v[:, swap], v_ref[:, swap], u[:, swap], torch.tensor([bottom_tie]))
    assert as_given.item() == pytest.approx(by_hand([0, 1, 2], bottom_tie), rel=1e-5)
    assert swapped.item() == pytest.approx(as_given.item(), rel=1e-6)


def test_gdro_gradient_raises_the_better_sample() -> None:
    """One step on the ranking loss lowers the better sample's error relative to the worse."""
    u = torch.tensor([[[1.0], [-1.0]]])
    v = torch.zeros(1, 2, 1, requires_grad=True)
    loss, _ = GroupRankingLoss(1.0, 0.05, 0.0)(
        v, torch.zeros(1, 2, 1), u, torch.tensor([[1.0, 0.0]])
    )
    loss.backward()
    assert v.grad is not None
    # descending the loss moves member 0 towards its target (+1) and member 1 away from its (-1)
    assert v.grad[0, 0, 0] < 0 and v.grad[0, 1, 0] < 0


# -- DiffusionNFT --------------------------------------------------------------------------------
def test_nft_loss_by_hand() -> None:
    x0 = torch.tensor([[1.0, 0.0]])
    eps = torch.tensor([[0.0, 1.0]])
    t = torch.tensor([0.5])
    xt = (1 - t) * x0 + t * eps  # [0.5, 0.5]
    v = torch.tensor([[1.0, 1.0]])
    v_old = torch.tensor([[0.0, 2.0]])
    # beta 0.5: v+ = [0.5, 1.5]; v- = 1.5 v_old - 0.5 v = [-0.5, 2.5]
    # x0+ = xt - 0.5 v+ = [0.25, -0.25] -> e+ = [-0.75, -0.25]: mean e^2 0.3125, mean|e| 0.5
    # x0- = [0.75, -0.75] -> e- = [-0.25, -0.75]: the same numbers -> both losses 0.625
    # r = 0.8: (0.8 * 0.625 + 0.2 * 0.625) / 0.5 = 1.25, times scale 5 = 6.25
    # KL to v_ref = 0: mean v^2 = 1, times 0.1
    loss, metrics = NFTLoss(beta=0.5, scale=5.0, kl_beta=0.1)(
        v, v_old, torch.zeros(1, 2), xt, x0, t, torch.tensor([0.8])
    )
    assert metrics["positive_loss"] == pytest.approx(0.625)
    assert metrics["negative_loss"] == pytest.approx(0.625)
    assert metrics["policy_loss"] == pytest.approx(6.25)
    assert loss.item() == pytest.approx(6.35)


def test_nft_at_half_optimality_with_old_equal_current_has_zero_policy_gradient() -> None:
    torch.manual_seed(0)
    v = torch.randn(4, 3, 2, requires_grad=True)
    x0, eps, t = torch.randn(4, 3, 2), torch.randn(4, 3, 2), torch.rand(4)
    xt = (1 - t.view(-1, 1, 1)) * x0 + t.view(-1, 1, 1) * eps
    loss, _ = NFTLoss(beta=0.7, kl_beta=0.0)(v, v.detach(), None, xt, x0, t, torch.full((4,), 0.5))
    loss.backward()
    assert v.grad is not None
    assert v.grad.abs().max().item() < 1e-6


def test_nft_optimality_one_moves_towards_the_sample() -> None:
    """At r = 1 only the positive policy is fitted: the gradient step lowers its x0 error."""
    x0, t = torch.tensor([[1.0]]), torch.tensor([0.5])
    xt = 0.5 * x0  # eps = 0
    v = torch.tensor([[2.0]], requires_grad=True)  # x0_hat = 0.5 - 1 = -0.5, target 1
    loss, _ = NFTLoss(beta=1.0, kl_beta=0.0)(v, v.detach(), None, xt, x0, t, torch.ones(1))
    loss.backward()
    assert v.grad is not None and v.grad.item() > 0  # descending lowers v, raising x0_hat


# -- time sampling -------------------------------------------------------------------------------
def test_time_densities() -> None:
    u = torch.linspace(0, 1, 100_001)[:-1]
    linear = sample_times(u, "linear", 0.0, 1.0)
    assert linear.mean().item() == pytest.approx(2 / 3, abs=1e-3)  # E[t] for p(t) = 2t
    uniform = sample_times(u, "uniform", 0.2, 0.6)
    assert uniform.min().item() == pytest.approx(0.2) and uniform.max().item() < 0.6
    logit = sample_times(u, "logit_normal", 0.0, 1.0)
    assert logit.median().item() == pytest.approx(0.5, abs=1e-3)
    with pytest.raises(ValueError, match="unknown time_sampling"):
        sample_times(u, "cosine", 0.0, 1.0)


# -- GDRO's corrected score ----------------------------------------------------------------------
def test_corrected_score_by_hand() -> None:
    from reward_models import REWARDS, CallableReward, build_reward

    class Task(CallableReward):
        def __init__(self) -> None:
            super().__init__(lambda prompts, completions: [0.9, 0.5], name="task")

    class Judge(CallableReward):
        name = "judge"

        def __init__(self) -> None:
            super().__init__(lambda prompts, completions: [0.0, 0.0], name="judge")

        def score(self, outputs, prompts, metadata):  # type: ignore[no-untyped-def]
            out = super().score(outputs, prompts, metadata)
            out.scores["coherence"] = torch.tensor([2.0, 4.0])
            out.scores["style"] = torch.tensor([2.5, 4.5])
            return out

    REWARDS["task"], REWARDS["judge"] = Task, Judge
    try:
        corrected = build_reward(
            "corrected_score",
            reward={"name": "task"},
            quality={"name": "judge"},
            quality_scores=["coherence", "style"],
        )
        scores = corrected(["a", "b"], ["p", "q"]).scores
    finally:
        del REWARDS["task"], REWARDS["judge"]
    # 0.9 * (2.25 - 3) + 0.2 = -0.475 (a high reward on a poor image);  0.5 * (4.25 - 3) + 0.2 = 0.825
    assert scores["corrected_score"].tolist() == pytest.approx([-0.475, 0.825])
    assert scores["quality"].tolist() == pytest.approx([2.25, 4.25])
