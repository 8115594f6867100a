"""Token losses, aggregations and RLOO against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from genrl.objectives.advantages import rloo_advantages
from genrl.objectives.losses import TokenClippedSurrogate, aggregate

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[True, True, False], [True, False, False]])


def test_aggregations() -> None:
    assert float(aggregate(VALUES, MASK, "sequence_mean")) == pytest.approx((1.5 + 4.0) / 2)
    assert float(aggregate(VALUES, MASK, "token_mean")) == pytest.approx(7 / 3)
    assert float(aggregate(VALUES, MASK, "constant", max_length=4)) == pytest.approx(7 / 8)
    with pytest.raises(ValueError, match="max_length"):
        aggregate(VALUES, MASK, "constant")
    # A row without tokens adds 0 and still counts as a sequence.
    empty = torch.tensor([[True, True, False], [False, False, False]])
    assert float(aggregate(VALUES, empty, "sequence_mean")) == pytest.approx(0.75)


def _pair(ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    old = torch.zeros(1, len(ratios))
    new = torch.log(torch.tensor([ratios]))
    return new, old, torch.ones(1, len(ratios), dtype=torch.bool)


def test_token_level_clipping_by_hand() -> None:
    new, old, mask = _pair([1.5, 0.5])
    loss_fn = TokenClippedSurrogate(0.2)
    # A = +1: token 1 clipped to 1.2 -> -1.2; token 2 keeps -0.5 (pessimistic max).
    loss, metrics = loss_fn(new, old, torch.tensor([1.0]), mask)
    assert float(loss) == pytest.approx((-1.2 - 0.5) / 2)
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    assert metrics["ratio_max"] == pytest.approx(1.5)
    # A = -1: token 1 keeps 1.5, token 2 clipped to 0.8.
    loss, _ = loss_fn(new, old, torch.tensor([-1.0]), mask)
    assert float(loss) == pytest.approx((1.5 + 0.8) / 2)
    # DAPO clip-higher: the upper bound moves to 1.28.
    loss, _ = TokenClippedSurrogate(0.2, 0.28)(new, old, torch.tensor([1.0]), mask)
    assert float(loss) == pytest.approx((-1.28 - 0.5) / 2)


def test_sequence_level_ratio_is_gspo() -> None:
    new, old, mask = _pair([1.5, 0.5])
    loss, metrics = TokenClippedSurrogate(0.2, level="sequence")(
        new, old, torch.tensor([1.0]), mask
    )
    ratio = math.sqrt(1.5 * 0.5)  # exp(mean log-ratio) = geometric mean
    assert float(loss) == pytest.approx(-ratio)
    assert metrics["ratio_mean"] == pytest.approx(ratio)
    # With a tight GSPO range the same sequence is clipped at 1 - 3e-4.
    loss, _ = TokenClippedSurrogate(3e-4, 4e-4, level="sequence")(
        new, old, torch.tensor([-1.0]), mask
    )
    assert float(loss) == pytest.approx(1 - 3e-4)


def test_masked_tokens_do_not_count() -> None:
    new, old, _ = _pair([1.5, 0.5, 3.0])
    mask = torch.tensor([[True, True, False]])
    a, _ = TokenClippedSurrogate(0.2)(new, old, torch.tensor([1.0]), mask)
    b, _ = TokenClippedSurrogate(0.2)(new[:, :2], old[:, :2], torch.tensor([1.0]), mask[:, :2])
    assert float(a) == pytest.approx(float(b))


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        TokenClippedSurrogate(0.2)(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="advantages"):
        TokenClippedSurrogate(0.2)(
            torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3)
        )


def test_rloo_by_hand() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 7.0])
    groups = torch.tensor([0, 0, 0, 1, 2])
    # Group 0: r_i - mean of the other two; groups of one have no baseline.
    expected = [1 - 2.5, 2 - 2.0, 3 - 1.5, 0.0, 0.0]
    assert rloo_advantages(rewards, groups).tolist() == pytest.approx(expected)


def test_masked_kl_ignores_very_unlikely_padding() -> None:
    from genrl.objectives.losses import token_kl

    log_probs = torch.tensor([[-1.0, -95.0]], requires_grad=True)
    ref = torch.tensor([[-1.1, 0.0]])
    mask = torch.tensor([[True, False]])
    kl = aggregate(token_kl(log_probs, ref, "k3", mask), mask, "token_mean")
    kl.backward()
    expected = math.exp(-0.1) + 0.1 - 1  # k3 of the one counted token
    assert float(kl) == pytest.approx(expected, abs=1e-6)
    assert torch.isfinite(log_probs.grad).all() and float(log_probs.grad[0, 1]) == 0.0


def test_selected_log_probs_equal_the_full_log_softmax() -> None:
    from samplers.autoregressive import TokenSampler

    logits = torch.randn(5, 3, 11, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(11, (5, 3), generator=torch.Generator().manual_seed(1))
    sampler = TokenSampler(temperature=0.7)
    full = sampler.log_probs(logits).gather(-1, targets[..., None]).squeeze(-1)
    assert torch.allclose(
        sampler.selected_log_probs(logits, targets, rows_per_chunk=2), full, atol=1e-6
    )


def test_selected_log_probs_do_not_depend_on_the_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small rows are scored in one piece by default, large ones 4 rows at a time; values and
    gradients are the same bits either way."""
    import samplers.autoregressive as autoregressive
    from samplers.autoregressive import TokenSampler

    sampler = TokenSampler(temperature=0.7)
    logits = torch.randn(12, 9, 29, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(29, (12, 9), generator=torch.Generator().manual_seed(1))
    weights = torch.linspace(-1, 1, 12 * 9).view(12, 9)
    results = []
    for rows in (1, 4, None):
        x = logits.clone().requires_grad_(True)
        values = sampler.selected_log_probs(x, targets, rows_per_chunk=rows)
        (values * weights).sum().backward()
        results.append((values.detach(), x.grad))
    for values, grad in results[1:]:
        assert torch.equal(values, results[0][0]) and torch.equal(grad, results[0][1])
    # The default chunk: as many rows as hold CHUNK_ELEMENTS logits, at least 4.
    assert autoregressive.default_rows_per_chunk(logits.shape) >= 12
    assert autoregressive.default_rows_per_chunk((16, 512, 151_936)) == 4
    monkeypatch.setattr(autoregressive, "CHUNK_ELEMENTS", 5 * 9 * 29)
    assert autoregressive.default_rows_per_chunk(logits.shape) == 5


def test_top_p_is_measured_on_the_top_k_distribution() -> None:
    from samplers.autoregressive import TokenSampler

    # Top-2 keeps 0.3 and 0.3 (renormalised 0.5 / 0.5); a 0.5 nucleus then keeps only one.
    log_probs = torch.log(torch.tensor([[0.3, 0.3, 0.2, 0.2]]))
    truncated = TokenSampler(top_k=2, top_p=0.5)._truncate(log_probs)
    assert torch.isfinite(truncated).sum() == 1


def test_dropout_is_disabled_in_token_policies() -> None:
    from torch import nn

    from pipelines.base import disable_dropout

    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.3))
    model[0].attention_dropout = 0.1  # the float attribute attention layers pass on
    disable_dropout(model)
    assert model[1].p == 0.0 and model[0].attention_dropout == 0.0


def test_new_aggregations_by_hand() -> None:
    # Token sum 7 over 3 tokens; row sums 3 and 4.
    assert float(aggregate(VALUES, MASK, "bnpo")) == pytest.approx(7 / 3)
    assert float(aggregate(VALUES, MASK, "sequence_sum")) == pytest.approx((3 + 4) / 2)
    # DAPO's token mean divides by the optimizer step's mean tokens per minibatch (TRL's
    # ``dapo``: num_items_in_batch / num_processes); 5 here.
    assert float(aggregate(VALUES, MASK, "token_mean", tokens_per_minibatch=5.0)) == pytest.approx(
        7 / 5
    )
    # Without it, the minibatch's own tokens (TRL's ``bnpo``).
    assert float(aggregate(VALUES, MASK, "token_mean")) == pytest.approx(7 / 3)


def test_token_mean_over_a_window_is_the_mean_over_all_its_tokens() -> None:
    """Two minibatches with 3 and 1 counted tokens, accumulated: each divides its token sum by
    the window's 2 tokens per minibatch, the trainer divides by the 2 minibatches, so the sum is
    the mean over the 4 tokens (bnpo would weigh the lone token 3 times more)."""
    first = (torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[True, True, True]]))
    second = (torch.tensor([[10.0, 0.0, 0.0]]), torch.tensor([[True, False, False]]))
    step = sum(float(aggregate(v, m, "token_mean", tokens_per_minibatch=2.0)) for v, m in (first, second)) / 2  # fmt: skip
    assert step == pytest.approx((1 + 2 + 3 + 10) / 4)
    bnpo = sum(float(aggregate(v, m, "bnpo")) for v, m in (first, second)) / 2
    assert bnpo == pytest.approx((2 + 10) / 2)


def test_sequence_ratio_honours_the_aggregation() -> None:
    """GSPO: sequence 0 has ratios (1.5, 0.5), one ratio s = sqrt(0.75) for both tokens;
    sequence 1 one token at 1.1. With A = +1 (inside the clip range):
    sequence_mean = (-s - 1.1) / 2; bnpo weighs sequence 0 twice: (-2 s - 1.1) / 3."""
    new = torch.log(torch.tensor([[1.5, 0.5], [1.1, 1.0]])).requires_grad_(True)
    old, mask = torch.zeros(2, 2), torch.tensor([[True, True], [True, False]])
    s = math.sqrt(0.75)
    loss, metrics = TokenClippedSurrogate(0.2, level="sequence")(
        new, old, torch.tensor([1.0, 1.0]), mask
    )
    assert float(loss) == pytest.approx((-s - 1.1) / 2)
    assert metrics["ratio_max"] == pytest.approx(1.1) and metrics["ratio_min"] == pytest.approx(s)
    # GSPO's gradient: -A s / |y| per token, then the mean over the 2 sequences.
    loss.backward()
    assert new.grad is not None
    torch.testing.assert_close(new.grad, torch.tensor([[-s / 4, -s / 4], [-1.1 / 2, 0.0]]))
    token_weighted, _ = TokenClippedSurrogate(0.2, level="sequence", aggregation="bnpo")(
        new.detach(), old, torch.tensor([1.0, 1.0]), mask
    )
    assert float(token_weighted) == pytest.approx((-2 * s - 1.1) / 3)


def test_sequence_ratio_logs_ppo_kl_as_verls_token_mean() -> None:
    """verl's GSPO loss logs ``ppo_kl`` as the token mean of old minus new log-prob, not a mean
    over sequences: log-ratios (log 1.5, log 0.5) and (log 1.1) give
    -(log 1.5 + log 0.5 + log 1.1) / 3 = 0.0641 (the mean over sequences would be 0.0243)."""
    new = torch.log(torch.tensor([[1.5, 0.5], [1.1, 1.0]]))
    old, mask = torch.zeros(2, 2), torch.tensor([[True, True], [True, False]])
    _, metrics = TokenClippedSurrogate(0.2, level="sequence")(
        new, old, torch.tensor([1.0, 1.0]), mask
    )
    token_mean = -(math.log(1.5) + math.log(0.5) + math.log(1.1)) / 3
    assert float(metrics["ppo_kl"]) == pytest.approx(token_mean, abs=1e-6)
    assert float(metrics["ppo_kl"]) == pytest.approx(0.0641, abs=1e-4)


def test_per_token_advantages_by_hand() -> None:
    # Ratio 1 everywhere: the loss is -A per counted token.
    new = torch.zeros(2, 3, requires_grad=True)
    advantages = torch.tensor([[1.0, -1.0, 5.0], [2.0, 0.0, 0.0]])
    loss, _ = TokenClippedSurrogate(0.2)(new, torch.zeros(2, 3), advantages, MASK)
    # sequence_mean: ((-1 + 1) / 2 + (-2) / 1) / 2 = -1.
    assert float(loss) == pytest.approx(-1.0)
    loss.backward()
    assert new.grad is not None
    torch.testing.assert_close(new.grad, torch.tensor([[-1 / 4, 1 / 4, 0.0], [-2 / 2, 0.0, 0.0]]))


def test_token_policy_loss_logs_trl_kl() -> None:
    """``kl`` is TRL's mean per-token k3 over the counted tokens; ``kl_loss`` the aggregated
    term beta multiplies."""
    from genrl.objectives.losses import token_kl, token_policy_loss

    log_probs = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -3.0, -3.0]])
    ref = torch.tensor([[-1.0, -1.0, -1.0], [-1.5, -1.0, -1.0]])
    loss_fn = TokenClippedSurrogate(0.2)
    loss, metrics = token_policy_loss(
        loss_fn, log_probs, log_probs, ref, torch.tensor([1.0, -1.0]), MASK, kl_beta=0.5
    )
    k3 = token_kl(log_probs, ref, "k3", MASK)  # counted: 0, e - 2, 1 / e
    assert metrics["kl"] == pytest.approx((math.e - 2 + math.exp(-1)) / 3, abs=1e-6)
    # kl_loss: sequence_mean of k3 = ((0 + e - 2) / 2 + 1 / e) / 2.
    assert metrics["kl_loss"] == pytest.approx(((math.e - 2) / 2 + math.exp(-1)) / 2, abs=1e-6)
    # Ratio 1: policy term -mean over sequences of A = -(1 - 1) / 2 = 0.
    assert metrics["policy_loss"] == pytest.approx(0.0, abs=1e-7)
    assert float(loss) == pytest.approx(0.5 * float(metrics["kl_loss"]), abs=1e-6)
    assert float(k3[0, 2]) == 0.0  # an uncounted token carries no KL
