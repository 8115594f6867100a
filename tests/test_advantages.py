"""Tests of the advantage estimators on small hand-computed examples."""

from __future__ import annotations

import math

import pytest
import torch

from genrl.objectives.advantages import (
    PerPromptStatTracker,
    clip_advantages,
    group_advantages,
    zero_std_fraction,
)

EPS = 1e-4

# Three groups with non-contiguous, unsorted ids:
#   id 7: rewards [1, 3]     mean 2, population std 1
#   id 3: rewards [2, 4, 6]  mean 4, population std sqrt((4 + 0 + 4) / 3) = sqrt(8/3)
#   id 9: rewards [5, 5]     mean 5, std 0
REWARDS = torch.tensor([1.0, 2.0, 3.0, 4.0, 6.0, 5.0, 5.0])
IDS = torch.tensor([7, 3, 7, 3, 3, 9, 9])
CENTRED = [-1.0, -2.0, 1.0, 0.0, 2.0, 0.0, 0.0]


def test_group_std_by_hand():
    s3 = math.sqrt(8 / 3)  # 1.6329932
    expected = torch.tensor(
        [-1 / (1 + EPS), -2 / (s3 + EPS), 1 / (1 + EPS), 0.0, 2 / (s3 + EPS), 0.0, 0.0]
    )
    got = group_advantages(REWARDS, IDS, std_mode="group")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_global_std_by_hand():
    # Whole batch: sum 26, sum of squares 1+4+9+16+36+25+25 = 116, n = 7.
    # variance = 116/7 - (26/7)^2 = (812 - 676) / 49 = 136/49, std = sqrt(136)/7 = 1.6659863.
    std = math.sqrt(136) / 7
    expected = torch.tensor([c / (std + EPS) for c in CENTRED])
    got = group_advantages(REWARDS, IDS, std_mode="global")
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_no_std_is_centred_reward():
    got = group_advantages(REWARDS, IDS, std_mode="none")
    assert torch.equal(got, torch.tensor(CENTRED))


def test_custom_eps_and_double_input():
    # Group [0, 2]: mean 1, std 1; with eps 0.5 the advantages are -+1/1.5.
    got = group_advantages(
        torch.tensor([0.0, 2.0], dtype=torch.float64), torch.tensor([0, 0]), eps=0.5
    )
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor([-1 / 1.5, 1 / 1.5]))


@pytest.mark.parametrize("std_mode", ["group", "global", "none"])
def test_zero_variance_group_gives_exactly_zero(std_mode):
    rewards = torch.tensor([0.3, 0.3, 0.3, 0.7, 0.1])
    ids = torch.tensor([0, 0, 0, 1, 1])
    got = group_advantages(rewards, ids, std_mode=std_mode)
    assert torch.equal(got[:3], torch.zeros(3))
    # All groups flat: all zeros (no NaN from 0 / 0).
    flat = group_advantages(torch.full((4,), 2.5), torch.tensor([0, 0, 1, 1]), std_mode=std_mode)
    assert torch.equal(flat, torch.zeros(4))


def test_singleton_group_gives_zero():
    got = group_advantages(torch.tensor([4.0, 1.0, 3.0]), torch.tensor([0, 1, 1]))
    assert got[0].item() == 0.0


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="std_mode"):
        group_advantages(REWARDS, IDS, std_mode="batch")
    with pytest.raises(ValueError, match=r"\[N\]"):
        group_advantages(REWARDS, IDS[:-1])
    with pytest.raises(ValueError, match=r"\[N\]"):
        group_advantages(REWARDS.reshape(7, 1), IDS.reshape(7, 1))


def test_clip_advantages():
    adv = torch.tensor([-7.0, -5.0, 0.0, 3.0, 6.0])
    assert torch.equal(clip_advantages(adv, 5.0), torch.tensor([-5.0, -5.0, 0.0, 3.0, 5.0]))
    assert torch.equal(clip_advantages(adv, 0.5), torch.tensor([-0.5, -0.5, 0.0, 0.5, 0.5]))
    assert clip_advantages(adv, None) is adv
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="positive"):
            clip_advantages(adv, bad)


def test_zero_std_fraction():
    # Groups 7 and 3 vary, group 9 is flat: 1 of 3.
    assert zero_std_fraction(REWARDS, IDS) == pytest.approx(1 / 3)
    # Within the tolerance 1e-6 a group counts as flat; just above it does not.
    rewards = torch.tensor([1.0, 1.0 + 5e-7, 0.0, 0.1, 2.0, 2.0])
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    assert zero_std_fraction(rewards, ids) == pytest.approx(2 / 3)
    assert zero_std_fraction(rewards, ids, tol=0.2) == 1.0
    assert zero_std_fraction(torch.tensor([0.0, 1.0]), torch.tensor([0, 0])) == 0.0


# ---------------------------------------------------------------- per-prompt stat tracker


def test_tracker_history_one_is_group_zscore_by_prompt_text():
    # "a": [1, 3] -> mean 2, std 1; "b": [2, 6] -> mean 4, std 2.
    prompts = ["a", "b", "a", "b"]
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0])
    tracker = PerPromptStatTracker(std_mode="group", history=1)
    got = tracker.update(prompts, rewards)
    expected = torch.tensor([-1 / (1 + EPS), -2 / (2 + EPS), 1 / (1 + EPS), 2 / (2 + EPS)])
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got, group_advantages(rewards, torch.tensor([0, 1, 0, 1])))
    # History 1 keeps nothing: a second call sees only its own batch.
    assert tracker.state_dict() == {"past": {}}
    again = tracker.update(["a", "a"], torch.tensor([10.0, 12.0]))
    torch.testing.assert_close(again, torch.tensor([-1 / (1 + EPS), 1 / (1 + EPS)]))


def test_tracker_pools_two_groups_with_the_same_prompt():
    # Two groups of "x" in one batch ([0, 2] and [4, 6]) are one pool: mean 3,
    # std sqrt((9 + 1 + 1 + 9) / 4) = sqrt(5). "y": [1, 1] is flat.
    prompts = ["x", "x", "y", "y", "x", "x"]
    rewards = torch.tensor([0.0, 2.0, 1.0, 1.0, 4.0, 6.0])
    got = PerPromptStatTracker().update(prompts, rewards)
    s5 = math.sqrt(5) + EPS
    expected = torch.tensor([-3 / s5, -1 / s5, 0.0, 0.0, 1 / s5, 3 / s5])
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_tracker_global_and_none_modes():
    prompts = ["a", "b", "a", "b"]
    rewards = torch.tensor([1.0, 2.0, 3.0, 6.0])
    # Centred: [-1, -2, 1, 2]. Batch std: mean 3, squares of deviations 4 + 1 + 0 + 9 = 14,
    # std sqrt(14 / 4) = sqrt(3.5).
    centred = torch.tensor([-1.0, -2.0, 1.0, 2.0])
    assert torch.equal(PerPromptStatTracker("none").update(prompts, rewards), centred)
    got = PerPromptStatTracker("global").update(prompts, rewards)
    torch.testing.assert_close(got, centred / (math.sqrt(3.5) + EPS))


def _history_two_first_calls(tracker):
    # Call 1: "a" [0, 2] -> mean 1, std 1.
    first = tracker.update(["a", "a"], torch.tensor([0.0, 2.0]))
    torch.testing.assert_close(first, torch.tensor([-1 / (1 + EPS), 1 / (1 + EPS)]))
    # Call 2: "a" [4, 6] pooled with [0, 2]: mean 3, std sqrt(5); "b" [1, 3] new: mean 2, std 1.
    second = tracker.update(["a", "a", "b", "b"], torch.tensor([4.0, 6.0, 1.0, 3.0]))
    s5 = math.sqrt(5) + EPS
    torch.testing.assert_close(
        second, torch.tensor([1 / s5, 3 / s5, -1 / (1 + EPS), 1 / (1 + EPS)]), rtol=1e-6, atol=1e-7
    )


def test_tracker_history_two_by_hand():
    tracker = PerPromptStatTracker(std_mode="group", history=2)
    _history_two_first_calls(tracker)
    # Call 3: history 2 keeps only the previous call, so "a" [3, 3] pools with [4, 6] only
    # (call 1's [0, 2] has dropped out): pool [4, 6, 3, 3], mean 4, deviations [0, 2, -1, -1],
    # variance 6 / 4 = 1.5. Both get -1 / (sqrt(1.5) + eps).
    third = tracker.update(["a", "a"], torch.tensor([3.0, 3.0]))
    expected = -1 / (math.sqrt(1.5) + EPS)
    torch.testing.assert_close(third, torch.tensor([expected, expected]))


def test_tracker_state_dict_round_trip():
    tracker = PerPromptStatTracker(std_mode="group", history=2)
    _history_two_first_calls(tracker)
    state = tracker.state_dict()
    assert state == {"past": {"a": [[4.0, 6.0]], "b": [[1.0, 3.0]]}}
    restored = PerPromptStatTracker(std_mode="group", history=2)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    prompts = ["b", "a", "b", "a"]
    rewards = torch.tensor([2.0, 5.0, 0.0, 1.0])
    assert torch.equal(restored.update(prompts, rewards), tracker.update(prompts, rewards))
    assert restored.state_dict() == tracker.state_dict()
    tracker.clear()
    assert tracker.state_dict() == {"past": {}}


def test_tracker_errors():
    with pytest.raises(ValueError, match="std_mode"):
        PerPromptStatTracker(std_mode="per_prompt")
    with pytest.raises(ValueError, match="history"):
        PerPromptStatTracker(history=0)
    with pytest.raises(ValueError, match="3 prompts but 2 rewards"):
        PerPromptStatTracker().update(["a", "b", "c"], torch.tensor([1.0, 2.0]))


def test_decoupled_group_rewards_by_hand():
    from genrl.objectives.advantages import decoupled_group_rewards

    groups = torch.tensor([0, 0, 1, 1])
    scores = {"a": torch.tensor([1.0, 0.0, 1.0, 1.0]), "b": torch.tensor([0.0, 1.0, 0.2, 0.6])}
    # a: z = [1, -1] in group 0, [0, 0] in group 1; b: [-1, 1] in both. s = a + 2b = [-1, 1, -2, 2],
    # mean 0, population std sqrt(10 / 4).
    out = decoupled_group_rewards(scores, {"a": 1.0, "b": 2.0}, groups, eps=0.0)
    expected = torch.tensor([-1.0, 1.0, -2.0, 2.0]) / math.sqrt(2.5)
    torch.testing.assert_close(out, expected)
    # A reward that applies to one sample per group (NaN elsewhere) adds nothing.
    scores["c"] = torch.tensor([math.nan, 1.0, 3.0, math.nan])
    with_c = decoupled_group_rewards(scores, {"a": 1.0, "b": 2.0, "c": 1.0}, groups, eps=0.0)
    torch.testing.assert_close(with_c, expected)


def test_decoupled_rewards_keep_combinations_that_a_summed_reward_collapses():
    """GDPO's motivating case: (a, b) = (1, 0) vs (0, 0) and (1, 1) vs (0, 0) give the same
    group z-score of the summed reward, but different decoupled values."""
    from genrl.objectives.advantages import decoupled_group_rewards

    groups = torch.tensor([0, 0, 1, 1])
    a, b = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0.0, 0.0, 1.0, 0.0])
    summed = group_advantages(a + b, groups, eps=0.0)
    assert summed.tolist() == [1.0, -1.0, 1.0, -1.0]
    decoupled = decoupled_group_rewards({"a": a, "b": b}, {"a": 1.0, "b": 1.0}, groups, eps=0.0)
    assert decoupled[2] == pytest.approx(2 * decoupled[0]) and decoupled[0] > 0


def test_sample_std_by_hand() -> None:
    """TRL and verl divide by ``torch.std`` (Bessel): id 7 [1, 3] -> std sqrt(2); id 3
    [2, 4, 6] -> std 2; id 9 [5, 5] -> 0."""
    r2 = math.sqrt(2)
    expected = torch.tensor(
        [-1 / (r2 + EPS), -2 / (2 + EPS), 1 / (r2 + EPS), 0.0, 2 / (2 + EPS), 0.0, 0.0]
    )
    got = group_advantages(REWARDS, IDS, std_estimator="sample")
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    # Global std with Bessel: 136/49 * 7/6 = 136/42.
    glob = group_advantages(REWARDS, IDS, std_mode="global", std_estimator="sample")
    std = math.sqrt(136 / 42)
    torch.testing.assert_close(glob, torch.tensor([c / (std + EPS) for c in CENTRED]))


def test_singleton_group_is_refused_by_the_sample_estimator() -> None:
    # Population: a lone sample is its own mean, advantage exactly 0 (Flow-GRPO's np.std).
    got = group_advantages(torch.tensor([4.0, 1.0, 3.0]), torch.tensor([0, 1, 1]))
    assert got[0].item() == 0.0
    # Sample: std of one value is undefined; refused rather than verl's raw score.
    with pytest.raises(ValueError, match="single sample"):
        group_advantages(
            torch.tensor([4.0, 1.0, 3.0]), torch.tensor([0, 1, 1]), std_estimator="sample"
        )


def test_per_step_rewards_are_normalised_column_by_column() -> None:
    """Flow-GRPO's ``kl_reward``: rewards ``[N, T]``, one column per step, each normalised on
    its own within the groups (its stat tracker works along axis 0)."""
    rewards = torch.tensor([[1.0, 10.0], [3.0, 10.0], [2.0, 0.0], [4.0, 8.0]])
    ids = torch.tensor([0, 0, 1, 1])
    got = group_advantages(rewards, ids, eps=0.0)
    # Column 0: groups [1, 3] and [2, 4] -> -1, 1, -1, 1; column 1: [10, 10] -> 0, 0; [0, 8] -> -1, 1.
    assert got.tolist() == [[-1.0, 0.0], [1.0, 0.0], [-1.0, -1.0], [1.0, 1.0]]
    tracker = PerPromptStatTracker(eps=0.0)
    torch.testing.assert_close(tracker.update(["a", "a", "b", "b"], rewards), got)
    with pytest.raises(ValueError, match="history"):
        PerPromptStatTracker(history=2).update(["a", "a", "b", "b"], rewards)


def test_median_centered_advantages_by_hand() -> None:
    """MC-GRPO (its released trainer): (r - median) / (MAD + 1e-3), the non-zero advantages of
    a group times size / their number, one pivot at the median per group."""
    from genrl.objectives.advantages import median_centered_advantages, sequence_advantages

    # Group 5 (positions 0, 2, 4): [0.2, 0.9, 0.5]: median 0.5, |r - 0.5| = [0.3, 0.4, 0] so
    #   MAD 0.3; A = [-0.3, 0.4, 0] / 0.301, two non-zero of three: times 3/2.
    # Group 1 (positions 1, 3, 5): [1, 0, 0]: median 0, MAD 0: A = [1, 0, 0] / 1e-3, one
    #   non-zero: times 3 -> 3000; the pivot is the first sample at the median (position 3).
    # Group 2 (positions 6, 7, 8): all 0.7: A = 0, the pivot is the first.
    rewards = torch.tensor([0.2, 1.0, 0.9, 0.0, 0.5, 0.0, 0.7, 0.7, 0.7])
    ids = torch.tensor([5, 1, 5, 1, 5, 1, 2, 2, 2])
    advantages, pivots = median_centered_advantages(rewards, ids)
    expected = [-0.45 / 0.301, 3000.0, 0.6 / 0.301, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(advantages, torch.tensor(expected), rtol=1e-5, atol=1e-3)
    assert pivots.nonzero()[:, 0].tolist() == [3, 4, 6]
    assert torch.equal(sequence_advantages(rewards, ids, "median", eps=1e-3), advantages)
    # A group of five: the median is the third smallest; MAD over the five deviations.
    five = torch.tensor([4.0, 1.0, 3.0, 10.0, 2.0])  # median 3, |r - 3| = [1, 2, 0, 7, 1]
    advantages, pivots = median_centered_advantages(five, torch.zeros(5, dtype=torch.long))
    scaled = torch.tensor([1.0, -2.0, 0.0, 7.0, -1.0]) / (1.0 + 1e-3) * (5 / 4)
    torch.testing.assert_close(advantages, scaled)
    assert pivots.tolist() == [False, False, True, False, False]


def test_median_groups_must_be_odd() -> None:
    from genrl.config.errors import ConfigError
    from genrl.objectives.advantages import validate_median_groups

    validate_median_groups("median", 3)
    validate_median_groups("group", 4)
    with pytest.raises(ConfigError, match=r"odd train\.group_size"):
        validate_median_groups("median", 4)
