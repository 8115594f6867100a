"""MSSR (``algorithm.advantage=mssr``): the Beta baseline, the batch-normalised advantages and the
entropy bonus checked against numbers worked out by hand, the tracker through a checkpoint, and
single-rollout training on the tiny LM and on the embedded Countdown LM."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from genrl.config.errors import ConfigError
from genrl.objectives.single_rollout import (
    BetaValueTracker,
    entropy_shaped_advantages,
    mssr_advantages,
)
from genrl.policies.protocols import EntropyTokenPolicy
from genrl.run.config import TrainConfig
from reward_models import REWARDS
from samplers.autoregressive import selected_log_probs, selected_log_probs_and_entropies
from tests.test_causal_lm import CountLetterA, lm_config, save_tiny_lm


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("lm"))


def test_tracker_over_two_iterations_by_hand() -> None:
    """rho 0.5, N0 4, v_init 0.5: every prompt starts at alpha = beta = 2 (V = 0.5).

    Iteration 1, ``p`` succeeds (1.0), ``q`` fails (0.1 <= 0.5 is no success):
    ``p``: alpha = 0.5 * 2 + 1 = 2, beta = 0.5 * 2 = 1 -> V = 2/3;
    ``q``: alpha = 1, beta = 2 -> V = 1/3.
    Iteration 2, ``p`` fails then succeeds, unseen ``r`` succeeds:
    ``p``: (1, 1.5) after the failure, (1.5, 0.75) after the success -> V = 2/3;
    ``r``: (2, 1) -> V = 2/3; ``q`` untouched.
    """
    tracker = BetaValueTracker(rho=0.5, prior_count=4.0, v_init=0.5)
    assert tracker.values(["p", "q"]).tolist() == [0.5, 0.5]
    tracker.update(["p", "q"], torch.tensor([1.0, 0.1]))
    torch.testing.assert_close(tracker.values(["p", "q"]), torch.tensor([2 / 3, 1 / 3]))
    assert tracker.state_dict() == {"counts": {"p": [2.0, 1.0], "q": [1.0, 2.0]}}
    tracker.update(["p", "p", "r"], torch.tensor([0.0, 1.0, 1.0]))
    assert tracker.state_dict() == {"counts": {"p": [1.5, 0.75], "q": [1.0, 2.0], "r": [2.0, 1.0]}}
    torch.testing.assert_close(
        tracker.values(["p", "q", "r", "new"]), torch.tensor([2 / 3, 1 / 3, 2 / 3, 0.5])
    )


def test_advantages_of_a_small_batch_by_hand() -> None:
    """The tracker of the test above after iteration 1 (V(p) = 2/3, V(r) = 0.5 unseen), batch
    ``p, p, r`` with rewards ``0, 1, 1``. Baselines are read before the update, so both ``p``
    samples use 2/3: raw ``A = (-2/3, 1/3, 1/2)``, mean 1/18, centred ``(-13, 5, 8) / 18``,
    population variance ``(169 + 25 + 64) / (3 * 324) = 43/162``, so
    ``A = (-13, 5, 8) / 18 * sqrt(162/43) = (-13, 5, 8) / sqrt(86)``."""
    tracker = BetaValueTracker(rho=0.5, prior_count=4.0, v_init=0.5)
    tracker.update(["p", "q"], torch.tensor([1.0, 0.1]))
    advantages = mssr_advantages(tracker, ["p", "p", "r"], torch.tensor([0.0, 1.0, 1.0]))
    torch.testing.assert_close(advantages, torch.tensor([-13.0, 5.0, 8.0]) / math.sqrt(86))
    # ... and the batch was learned afterwards (the second test's state).
    assert tracker.state_dict()["counts"]["p"] == [1.5, 0.75]  # type: ignore[index]
    # A batch of one sample is not normalised; a constant batch is centred to 0 (var floor).
    single = mssr_advantages(BetaValueTracker(), ["x"], torch.tensor([1.0]))
    torch.testing.assert_close(single, torch.tensor([0.5]))
    flat = mssr_advantages(BetaValueTracker(), ["x", "y"], torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(flat, torch.zeros(2))


def test_entropy_shaping_by_hand() -> None:
    """alpha 0.4, kappa 2. Row 0 (A = 1, cap 0.5): 0.4 H = (0.2, 0.8, 1.2) -> bonus (0.2, 0.5,
    masked) -> (1.2, 1.5, 0). Row 1 (A = -0.8, cap 0.4): 0.4 H = (0.04, 0.6, 0) -> bonus
    (0.04, 0.4, 0) -> (-0.76, -0.4, -0.8)."""
    advantages = torch.tensor([1.0, -0.8])
    entropies = torch.tensor([[0.5, 2.0, 3.0], [0.1, 1.5, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    shaped = entropy_shaped_advantages(advantages, entropies, mask, alpha=0.4, kappa=2.0)
    torch.testing.assert_close(shaped, torch.tensor([[1.2, 1.5, 0.0], [-0.76, -0.4, -0.8]]))
    assert not shaped.requires_grad  # detached entropies


def test_entropies_of_the_scoring_forward() -> None:
    """Uniform logits have entropy log V at any temperature; otherwise the entropy is that of
    softmax(logits / T), and the log-probs equal ``selected_log_probs`` bit for bit."""
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7)
    targets = torch.randint(0, 7, (3, 5))
    log_probs, entropies = selected_log_probs_and_entropies(logits, targets, 2.0)
    assert torch.equal(log_probs, selected_log_probs(logits, targets, 2.0))
    p = torch.softmax(logits / 2.0, dim=-1)
    torch.testing.assert_close(entropies, -(p * p.log()).sum(-1))
    _, flat = selected_log_probs_and_entropies(torch.zeros(1, 2, 4), torch.zeros(1, 2).long())
    torch.testing.assert_close(flat, torch.full((1, 2), math.log(4)))
    # A token ruled out by a -inf logit (a VLM's vision placeholders) leaves log 3, not NaN.
    ruled_out = torch.zeros(1, 2, 4)
    ruled_out[..., 3] = float("-inf")
    _, three = selected_log_probs_and_entropies(ruled_out, torch.zeros(1, 2).long())
    torch.testing.assert_close(three, torch.full((1, 2), math.log(3)))


def mssr_lm_config(tmp_path: Path, lm_dir: Path, **algorithm: object) -> TrainConfig:
    config = lm_config(tmp_path, lm_dir, advantage="mssr", **algorithm)
    config.train.prompts_per_iteration, config.train.group_size = 8, 1
    return config


def test_validation(tmp_path: Path, lm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REWARDS, "letter_a", CountLetterA)
    config = lm_config(tmp_path, lm_dir, advantage="mssr")  # groups of 4
    with pytest.raises(ConfigError, match=r"single-rollout: set train\.group_size=1"):
        config.validate()
    config = mssr_lm_config(tmp_path, lm_dir, mssr_rho=1.5)
    with pytest.raises(ConfigError, match=r"mssr_rho"):
        config.validate()
    config = mssr_lm_config(tmp_path, lm_dir)
    config.train.dynamic_sampling = True
    config.train.dynamic_sampling_metric = "letter_a"
    with pytest.raises(ConfigError, match=r"dynamic_sampling"):
        config.validate()
    mssr_lm_config(tmp_path, lm_dir).validate()
    # Without mssr, groups of one are still refused.
    config = lm_config(tmp_path, lm_dir)
    config.train.group_size = 1
    with pytest.raises(ConfigError, match=r"group_size must be >= 2"):
        config.validate()


@pytest.mark.parametrize("entropy", ["full", "sampled"])
def test_single_rollout_training_on_the_tiny_lm(
    tmp_path: Path, lm_dir: Path, monkeypatch: pytest.MonkeyPatch, entropy: str
) -> None:
    """Units carry ``[N, T]`` shaped advantages built from the phase-4 ones and the entropies
    of the sampling policy; two iterations change the parameters."""
    from genrl.loop.trainer import Trainer

    monkeypatch.setitem(REWARDS, "letter_a", CountLetterA)
    trainer = Trainer(mssr_lm_config(tmp_path, lm_dir, mssr_entropy=entropy))
    params = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    batch = trainer.collect()
    assert batch.rollout.advantages.shape == (8,)
    units = trainer.objective.units(trainer.policy, batch.rollout, batch.noise)
    mask = units.completion_mask
    if entropy == "full":
        inputs = (units.input_ids, units.attention_mask)
        completion = units.input_ids[:, units.completion_start :]
        scorer = trainer.policy
        assert isinstance(scorer, EntropyTokenPolicy)
        _, h = scorer.token_log_probs_and_entropies(*inputs, completion, 1.0)
    else:
        h = -(units.old_log_probs.exp() * units.old_log_probs)
    expected = entropy_shaped_advantages(batch.rollout.advantages, h, mask)
    torch.testing.assert_close(units.advantages, expected)
    assert bool((units.advantages[mask] != 0).any())
    first = trainer.train_iteration()
    assert first["loss/first_minibatch_ratio_deviation"] == 0.0
    trainer.train_iteration()
    after = dict(trainer.policy.network.named_parameters())
    assert any(not torch.equal(p, after[n]) for n, p in params.items())


def test_tracker_survives_a_checkpoint(
    tmp_path: Path, lm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Save after one iteration, resume in a fresh trainer: the same tracker, and the next
    iteration gives the same advantages and parameters as the run that went on."""
    from genrl.loop.trainer import Trainer

    monkeypatch.setitem(REWARDS, "letter_a", CountLetterA)
    config = mssr_lm_config(tmp_path, lm_dir)
    config.train.iterations = 3
    original = Trainer(config, run_dir=tmp_path / "a")
    original.train_iteration()
    original.iteration = 1
    path = original.save_checkpoint()
    assert path is not None
    state = original.objective.state_dict()
    assert len(state["mssr_tracker"]["counts"]) == 4  # the 4 prompts, 8 draws

    resumed = Trainer(config, run_dir=tmp_path / "b")
    assert resumed.objective.state_dict()["mssr_tracker"]["counts"] == {}
    resumed.load_checkpoint(path)
    assert resumed.objective.state_dict() == state
    ahead, behind = original.collect(), resumed.collect()
    assert ahead.rollout.completions == behind.rollout.completions
    assert torch.equal(ahead.rollout.advantages, behind.rollout.advantages)
    assert resumed.objective.state_dict() == original.objective.state_dict()


def test_countdown_mssr_recipe_trains_two_steps(tmp_path: Path) -> None:
    """The recipe on the embedded Countdown LM, shrunk to 2 iterations of 16 prompts x 1."""
    from genrl.loop.trainer import Trainer
    from genrl.recipes.text import llm_countdown_grpo, llm_countdown_mssr

    config = llm_countdown_mssr()
    grpo = llm_countdown_grpo()
    per_iteration = config.train.prompts_per_iteration * config.train.group_size
    assert per_iteration == grpo.train.prompts_per_iteration * grpo.train.group_size
    config.train.iterations, config.train.prompts_per_iteration = 2, 16
    config.train.minibatch_size = 8
    config.output_dir = str(tmp_path / "run")
    config.eval.every = 0
    config.logging.tensorboard = config.logging.progress_bar = False
    config.validate()
    trainer = Trainer(config)
    params = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    for _ in range(2):
        metrics = trainer.train_iteration()
        assert math.isfinite(metrics["loss/total"])
    after = dict(trainer.policy.network.named_parameters())
    changed = [n for n, p in params.items() if not torch.equal(p, after[n])]
    assert changed
    assert trainer.objective.state_dict()["mssr_tracker"]["counts"]
