"""MARBLE (``genrl/objectives/marble.py``): per-reward advantages by hand, the affine
amortisation, the baseline's loss equal to DiffusionNFT's, two training steps on the
compositional task, and configuration errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from genrl import Trainer, get_recipe
from genrl.algorithms.marble import MarbleConfig
from genrl.config.errors import ConfigError
from genrl.objectives.marble import MarbleObjective, fill_missing_with_group_mean
from genrl.objectives.regression_losses import NFTLoss
from genrl.objectives.regression_objectives import NFTObjective
from genrl.run.config import TrainConfig
from tests.compositional_tiny import tiny_compositional_config


def test_per_reward_advantages_by_hand() -> None:
    config = MarbleConfig(std_mode="group", advantage_clip=5.0)
    objective = MarbleObjective(config, rollout=None, group_size=2, reward_names=["a", "b"])
    # Two groups of two. Reward a: (1, 0) and (2, 2); reward b: (0, 4) and (NaN, 3).
    scores = torch.tensor([[1.0, 0.0], [0.0, 4.0], [2.0, float("nan")], [2.0, 3.0]])
    combined = scores.nansum(dim=1)  # the weighted sum the trainer would pass: 1, 4, 2, 5
    group_ids = torch.tensor([0, 0, 1, 1])
    prompts = ["p", "p", "q", "q"]
    advantages = objective.advantages(combined, prompts, group_ids, reward_scores=scores)
    assert advantages.shape == (4, 3)
    # Population std 0.5 within group 0 for a, 2 for b; group 1's a is constant; its NaN b is
    # filled with the group's finite mean (3) and its advantage set to 0.
    eps = 1e-4
    assert advantages[:, 1].tolist() == pytest.approx([0.5 / (0.5 + eps), -0.5 / (0.5 + eps), 0, 0])
    assert advantages[:, 2].tolist() == pytest.approx([-2 / (2 + eps), 2 / (2 + eps), 0.0, 0.0])
    # Column 0 is DiffusionNFT's advantage of the combined reward: (1, 4) -> -1, +1; (2, 5).
    assert advantages[:, 0].tolist() == pytest.approx(
        [-1.5 / (1.5 + eps), 1.5 / (1.5 + eps), -1.5 / (1.5 + eps), 1.5 / (1.5 + eps)]
    )
    # The logged advantages are column 0's (mean 0, magnitude 1.5 / 1.5001), not an average
    # over the 1 + K columns; each balanced reward's column has its own magnitude.
    metrics = objective.advantage_metrics(advantages)
    assert metrics["advantages/mean"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["advantages/abs_mean"] == pytest.approx(1.5 / (1.5 + eps))
    assert metrics["advantages/a/abs_mean"] == pytest.approx(0.5 / (0.5 + eps) / 2)
    assert metrics["advantages/b/abs_mean"] == pytest.approx(2 / (2 + eps) / 2)
    filled = fill_missing_with_group_mean(scores, group_ids)
    assert filled[2, 1] == 3.0 and torch.equal(filled[[0, 1, 3]], scores[[0, 1, 3]])


def test_a_mixed_optimality_gives_the_mixed_gradient() -> None:
    # The amortisation: grad L(sum_k w_k r_k) = sum_k w_k grad L(r_k) for w on the simplex.
    torch.manual_seed(0)
    loss_fn = NFTLoss(beta=0.5)
    theta = torch.randn(6, 3, requires_grad=True)
    old, noised, clean = torch.randn(6, 3), torch.randn(6, 3), torch.randn(6, 3)
    sigma = torch.rand(6)
    r = torch.rand(6, 2)
    w = torch.tensor([0.3, 0.7])
    positive, negative = loss_fn.branch_losses(theta * 2, old, noised, clean, sigma)
    losses = loss_fn.policy_loss(positive, negative, r)
    grads = [torch.autograd.grad(loss, theta, retain_graph=True)[0] for loss in losses]
    mixed = loss_fn.policy_loss(positive, negative, r @ w)
    (mixed_grad,) = torch.autograd.grad(mixed, theta)
    torch.testing.assert_close(mixed_grad, w[0] * grads[0] + w[1] * grads[1])
    # And the single-r loss is NFTLoss's own policy loss.
    _, metrics = loss_fn(theta * 2, old, None, noised, clean, sigma, r[:, 0])
    torch.testing.assert_close(metrics["policy_loss"], losses[0].detach())


def _tiny(directory: Path, recipe: str, *overrides: str) -> TrainConfig:
    return tiny_compositional_config(
        directory, recipe, "algorithm.noisings_per_sample=2", *overrides
    )


VARIANTS = {
    "min_norm": ("compositional_marble", ()),
    "velocity_every_2_raw": (
        "compositional_marble",
        (
            "algorithm.gradient_space=velocity",
            "algorithm.balance_every=2",
            "algorithm.direction=raw",
        ),
    ),
    "weighted_sum": ("compositional_marble_weighted_sum", ()),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_steps_train_and_log_the_balance(tmp_path: Path, variant: str) -> None:
    recipe, overrides = VARIANTS[variant]
    # The tiny random models score 0 on both of the recipe's rewards; sample_diversity varies,
    # so it joins as a third reward (and the three-reward solver runs).
    config = _tiny(tmp_path, recipe, "reward.1.weight=1.0", *overrides)
    trainer = Trainer(config, run_dir=tmp_path / "run")
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    trainer.train_iteration()
    metrics = trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    moved = [n for n, p in before.items() if not torch.equal(p, after[n])]
    assert len(moved) >= 0.9 * len(before)
    assert math.isfinite(metrics["loss/total"])
    for name in ("compositional", "sample_diversity", "compositional_artifact_probe"):
        assert -1 <= metrics[f"loss/balance/cosine/{name}"] <= 1
    assert 0 <= metrics["loss/balance/worst_negative"] <= 1
    objective = trainer.objective
    assert isinstance(objective, MarbleObjective)
    if variant == "weighted_sum":
        assert objective.weights is None
        assert "loss/balance/weight/compositional" not in metrics
    else:
        assert objective.weights is not None
        assert float(objective.weights.sum()) == pytest.approx(1.0, abs=1e-6)
        assert (objective.weights >= 0).all()
        alphas = [metrics[f"loss/balance/alpha/{n}"] for n in objective.reward_names]
        assert sum(alphas) == pytest.approx(1.0, abs=1e-6)
    state = objective.state_dict()
    objective.load_state_dict(state)
    assert objective.state_dict() == state


def test_the_baseline_loss_is_diffusion_nfts(tmp_path: Path) -> None:
    trainer = Trainer(
        _tiny(tmp_path, "compositional_marble_weighted_sum"), run_dir=tmp_path / "run"
    )
    batch = trainer.collect()
    objective = trainer.objective
    assert batch.rollout.advantages.shape == (16, 3)
    units = objective.units(trainer.policy, batch.rollout, batch.noise)
    nft = NFTObjective(objective.config, objective.rollout, 4)
    plain = units.select(torch.arange(len(units)))
    plain.advantages = units.advantages[..., 0]
    torch.manual_seed(0)
    marble_loss, metrics = objective.loss(trainer.policy, units)
    nft_loss, _ = nft.loss(trainer.policy, plain)
    torch.testing.assert_close(marble_loss, nft_loss)
    assert metrics["balance/worst_cosine"] <= 1


def test_without_smoothing_no_reward_is_anti_aligned_with_the_update(tmp_path: Path) -> None:
    # rho = 0 and the normalised direction: the update is the min-norm point itself, so every
    # reward's cosine with it is >= 0 (the program's optimality condition), while the plain sum
    # of the same gradients may point against one of them.
    config = _tiny(
        tmp_path, "compositional_marble", "reward.1.weight=1.0", "algorithm.balance_ema=0"
    )
    trainer = Trainer(config, run_dir=tmp_path / "run")
    trainer.train_iteration()  # moves the policy off the lagged copy
    batch = trainer.collect()
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    for start in range(0, len(units), 16):
        _, metrics = trainer.objective.loss(
            trainer.policy, units.select(torch.arange(start, start + 16))
        )
        assert float(metrics["balance/worst_cosine"]) >= -1e-6
        assert float(metrics["balance/worst_negative"]) == 0.0


def test_configuration_errors() -> None:
    config = get_recipe("compositional_marble")
    config.reward[2].weight = 0.0
    with pytest.raises(ConfigError, match="two or more distinct rewards"):
        config.validate()
    config = get_recipe("compositional_marble")
    with pytest.raises(ConfigError, match="not among the run's rewards"):
        config.apply_overrides(['algorithm.balance_rewards=["compositional", "nope"]'])
        config.validate()
    config = get_recipe("compositional_marble")
    config.apply_overrides(["algorithm.balance_ema=1.0"])
    with pytest.raises(ConfigError, match="balance_ema"):
        config.validate()
