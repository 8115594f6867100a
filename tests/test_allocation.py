"""Allocation policies (``genrl/allocation/``): Pilot-Commit and sGPO.

Hand-computed choices (pilot verdicts, kept samples, committed prompts, group sizes, the
schedule), the two-stage iteration on a fake sampler whose accuracies are fixed per prompt,
checkpoints of the buffer, config errors, and two iterations of each on the embedded Countdown
LM.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from genrl import get_recipe
from genrl.allocation.adaptive_rollouts import AdaptiveRollouts
from genrl.allocation.base import ScoredRound
from genrl.allocation.configs import AdaptiveRolloutsConfig, PilotCommitConfig, SortedGroupsConfig
from genrl.allocation.pilot_commit import Pilot, PilotCommit, max_variance_subset, pass_pilot
from genrl.allocation.sorted_groups import SortedGroups, group_size_for, schedule
from genrl.config.errors import ConfigError
from genrl.data.batches import TokenRollout
from genrl.loop.trainer import Trainer
from genrl.reporting.metrics import read_metrics
from tests.resume_check import straight_and_resumed

# Prompt "p<k>" is solved by samples 0 .. ACCURACY[k] - 1 of every 8 (a fixed pattern, so
# pilot means are known by hand): p0 never, p1 1 of 8, ..., p8 always.
PROMPTS = [f"p{k}" for k in range(9)]


def _rollout(prompts: list[str]) -> TokenRollout:
    n = len(prompts)
    return TokenRollout(
        prompts=list(prompts),
        completions=[f"c{i}" for i in range(n)],
        group_ids=torch.zeros(n, dtype=torch.long),
        input_ids=torch.arange(n).unsqueeze(1).repeat(1, 3),
        attention_mask=torch.ones(n, 3, dtype=torch.long),
        completion_mask=torch.ones(n, 2, dtype=torch.bool),
        old_log_probs=torch.zeros(n, 0),
        ref_log_probs=torch.zeros(n, 0),
        finished=torch.ones(n, dtype=torch.bool),
        advantages=torch.zeros(n),
    )


class FakeSampler:
    """Scores sample ``j`` of prompt ``p<k>`` 1 when ``j % 8 < k``; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[int], int]] = []

    def __call__(self, prompts: list[Any], counts: list[int], round_index: int) -> ScoredRound:
        self.calls.append((list(prompts), list(counts), round_index))
        expanded = [p for p, c in zip(prompts, counts, strict=True) for _ in range(c)]
        correct = [
            float(j % 8 < int(p[1:]))
            for p, c in zip(prompts, counts, strict=True)
            for j in range(c)
        ]
        group_ids = torch.arange(len(prompts)).repeat_interleave(torch.tensor(counts))
        scores = {"acc": torch.tensor(correct), "reward": torch.tensor(correct) * 2}
        return ScoredRound(expanded, group_ids, _rollout(expanded), scores)


def _draw(count: int, offset: int) -> list[str]:
    return [PROMPTS[(offset + i) % len(PROMPTS)] for i in range(count)]


def _pilot_commit(**fields: Any) -> PilotCommit:
    config = PilotCommitConfig(**fields)
    return PilotCommit(config, 2, 4, "acc", 0, PROMPTS)


def test_pilot_verdicts_follow_the_released_thresholds() -> None:
    # filter_batch: lower <= mean <= 1 - upper passes (0.125 and 0.75 in the 1.5B script)
    assert pass_pilot(0.125, 0.125, 0.75) == "pass"
    assert pass_pilot(0.75, 0.125, 0.75) == "pass"
    assert pass_pilot(0.124, 0.125, 0.75) == "too_hard"
    assert pass_pilot(0.875, 0.125, 0.75) == "too_easy"


def test_max_variance_keeps_half_correct_where_it_can() -> None:
    g = torch.Generator().manual_seed(0)
    metric = torch.tensor([1.0, 0, 0, 1, 0, 0])
    picked = max_variance_subset(metric, 4, g)
    assert sorted(metric[picked].tolist()) == [0, 0, 1, 1]
    # only one correct sample: it and three wrong ones
    one_correct = torch.tensor([0.0, 0, 1, 0, 0])
    picked = max_variance_subset(one_correct, 4, g)
    assert len(picked) == 4 and one_correct[picked].sum() == 1
    # only one wrong sample: it and the rest correct
    few_wrong = torch.tensor([1.0, 1, 1, 0, 1])
    assert few_wrong[max_variance_subset(few_wrong, 4, g)].sum() == 3


def test_commit_takes_the_highest_pilot_std_then_the_newest() -> None:
    policy = _pilot_commit()
    for key, values, iteration in [
        ("a", [1.0, 0, 0, 0], 0),  # std 0.433
        ("b", [1.0, 1, 0, 0], 0),  # std 0.5
        ("c", [1.0, 0, 1, 0], 1),  # std 0.5, newer
    ]:
        metric = torch.tensor(values, dtype=torch.float64)
        policy.buffer[key] = Pilot(key, iteration, _rollout([key] * 4), {}, metric)
    taken = policy.take(2, torch.Generator())
    assert [p.prompt for p in taken] == ["c", "b"]
    assert list(policy.buffer) == ["a"]
    # fewer buffered than asked: all of them, oldest first
    assert [p.prompt for p in policy.take(5, torch.Generator())] == ["a"]


def test_old_pilots_leave_the_buffer() -> None:
    policy = _pilot_commit(max_off_iterations=2)
    for key, iteration in [("a", 0), ("b", 1), ("c", 3)]:
        policy.buffer[key] = Pilot(key, iteration, _rollout([key]), {}, torch.zeros(1))
    assert policy.flush(3) == 1  # 3 - 0 > 2
    assert list(policy.buffer) == ["b", "c"]


def test_an_iteration_explores_then_commits_pilot_plus_fresh_samples() -> None:
    # 2 groups of 4 fresh samples; pilots of 8 on 2 * 3 = 6 prompts per round
    policy = _pilot_commit(pilot_samples=8, kept_pilot_samples=4)
    sampler = FakeSampler()
    allocation = policy.allocate(0, _draw, sampler)
    # round 0: p0..p5 explored (pilot means k/8), nothing to commit; p1..p5 pass, p0 is too
    # hard. Round 1: p6, p7, p8, p0, p1, p2 explored, and the two highest-std pilots committed:
    # p4 (std 0.5), then p3 or p5 (equal stds, 0.484; the tie goes to the insertion order
    # unless rounding separates them).
    assert [c[1] for c in sampler.calls] == [[8] * 6, [8] * 6 + [4, 4]]
    second = sampler.calls[1][0][7]
    assert sampler.calls[1][0][6] == "p4" and second in {"p3", "p5"}
    assert allocation.generated == 48 + 56
    assert allocation.group_ids.tolist() == [0] * 8 + [1] * 8
    assert allocation.prompts == ["p4"] * 8 + [second] * 8
    # each group: 4 kept pilot samples (2 correct, 2 wrong) then the 4 fresh ones
    assert allocation.scores["acc"][:4].sum() == 2 and allocation.scores["acc"][8:12].sum() == 2
    assert allocation.scores["acc"][4:8].tolist() == [1, 1, 1, 1]  # p4: samples 0-3 correct
    fresh = [1, 1, 1, 0] if second == "p3" else [1, 1, 1, 1]
    assert allocation.scores["acc"][12:].tolist() == fresh
    assert allocation.scores["reward"].tolist() == (allocation.scores["acc"] * 2).tolist()
    # p8 (always solved) is evicted; p6 (0.75) passes, p7 (0.875) is too easy; p1 and p2 are
    # buffered again with their newer pilots
    assert policy.evicted == {"p8"}
    assert sorted(policy.buffer) == sorted({"p1", "p2", "p3", "p5", "p6"} - {second})
    assert allocation.metrics["rounds"] == 2
    assert allocation.sampled_scores["acc"].shape == (104,)
    # an evicted prompt is skipped by every later draw
    assert policy.explore(_draw, 6) == (["p6", "p7", "p0", "p1", "p2", "p3"], 18)
    # the next iteration commits from the buffer in its first round
    nxt = policy.allocate(1, _draw, FakeSampler())
    assert nxt.metrics["rounds"] == 1 and nxt.metrics["pilot_lag_mean"] == 1.0


def test_the_buffer_goes_through_a_weights_only_checkpoint() -> None:
    policy = _pilot_commit(pilot_samples=8)
    policy.allocate(0, _draw, FakeSampler())
    file = io.BytesIO()
    torch.save(policy.state_dict(), file)
    file.seek(0)
    restored = _pilot_commit(pilot_samples=8)
    restored.load_state_dict(torch.load(file, weights_only=True))
    assert list(restored.buffer) == list(policy.buffer)
    assert restored.evicted == policy.evicted
    for key, pilot in policy.buffer.items():
        again = restored.buffer[key]
        assert again.rollout.prompts == pilot.rollout.prompts
        assert torch.equal(again.rollout.input_ids, pilot.rollout.input_ids)
        assert torch.equal(again.metric, pilot.metric)


def test_sgpo_group_sizes_are_the_inverse_success_rate() -> None:
    assert group_size_for(1 / 8, 2, 32) == 8
    assert group_size_for(0.3, 2, 32) == 4  # ceil(3.33)
    assert group_size_for(0.5, 2, 32) == 2
    assert group_size_for(0.9, 2, 32) == 2  # the smallest group
    assert group_size_for(0.0, 2, 32) == 32
    assert group_size_for(0.01, 2, 16) == 16


def test_sgpo_schedule_drops_solved_subsamples_unsolved_and_sorts_easy_first() -> None:
    success = {"a": 0.25, "b": 1.0, "c": 0.0, "d": 0.75, "e": 0.0, "f": 0.25, "g": 0.0}
    order = list("abcdefg")
    assert schedule(order, success, 0.5, "easy_to_hard") == ["d", "a", "f", "c", "e"]
    assert schedule(order, success, 0.0, "shuffled") == ["a", "d", "f"]


def test_sgpo_profiles_once_then_fills_the_uniform_budget() -> None:
    config = SortedGroupsConfig(profile_samples=8, max_group_size=8, unsolvable_keep=0.0)
    policy = SortedGroups(config, 2, 4, "acc", 0, PROMPTS)
    sampler = FakeSampler()
    first = policy.allocate(0, _draw, sampler)
    # profile: 9 prompts, 8 samples each, in rounds of 2 * 4 // 8 = 1 prompt
    assert sum(len(c[0]) for c in sampler.calls[:-1]) == 9
    assert policy.order == ["p7", "p6", "p5", "p4", "p3", "p2", "p1"]
    # budget 8: p7, p6, p5 (groups of 2, 2, 2), then p4 (2) fills it
    assert sampler.calls[-1][:2] == (["p7", "p6", "p5", "p4"], [2, 2, 2, 2])
    assert first.generated == 72 + 8
    second = policy.allocate(1, _draw, sampler)
    # p3 (3/8 -> 3), p2 (2/8 -> 4), then p1 (8) would exceed 8 samples
    assert sampler.calls[-1][:2] == (["p3", "p2"], [3, 4])
    assert second.generated == 7 and second.metrics["profile_samples"] == 0


def test_adaptive_rollouts_add_stages_until_a_prompt_has_a_correct_sample() -> None:
    config = AdaptiveRolloutsConfig(stage_samples=2, max_stages=3)
    policy = AdaptiveRollouts(config, 3, 4, "acc", 0, PROMPTS)
    sampler = FakeSampler()
    # p0 (never solved), p1 (sample j solved when j % 8 < 1), p2 (j % 8 < 2)
    allocation = policy.allocate(0, _draw, sampler)
    # stage 0: 2 each; p1 and p2 have their sample 0 correct, p0 goes on alone to 3 stages
    assert [c[:2] for c in sampler.calls] == [
        (["p0", "p1", "p2"], [2, 2, 2]),
        (["p0"], [2]),
        (["p0"], [2]),
    ]
    assert allocation.prompts == ["p0"] * 6 + ["p1"] * 2 + ["p2"] * 2
    assert allocation.group_ids.tolist() == [0] * 6 + [1] * 2 + [2] * 2
    assert allocation.scores["acc"].tolist() == [0] * 6 + [1, 0] + [1, 1]
    assert allocation.generated == 10
    assert allocation.metrics["unsolved_fraction"] == 1 / 3
    assert allocation.metrics["stages"] == 3


# -- on the embedded Countdown LM ------------------------------------------------------------

SMALL = (
    "train.prompts_per_iteration=4",
    "train.group_size=4",
    "train.minibatch_size=32",
    "train.inner_epochs=1",
    "eval.every=0",
    "logging.progress_bar=false",
    "logging.log_every=100",
    "logging.report_to=[]",
    "allocation.metric=countdown/accuracy",
)


def _config(*overrides: str) -> Any:
    return get_recipe("llm_countdown_grpo").apply_overrides([*SMALL, *overrides])


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
@pytest.mark.parametrize(
    "overrides",
    [
        ("allocation.name=pilot_commit", "allocation.pilot_commit.pilot_prompts_factor=1"),
        ("allocation.name=sorted_groups", "allocation.sorted_groups.profile_prompts=16"),
        ("allocation.name=adaptive_rollouts", "allocation.adaptive_rollouts.max_stages=2"),
    ],
)
def test_two_iterations_train_the_countdown_lm(tmp_path: Path, overrides: tuple[str, ...]) -> None:
    trainer = Trainer(_config("train.iterations=2", *overrides), run_dir=tmp_path / "run")
    before = {k: v.clone() for k, v in trainer.policy.trainable_state_dict().items()}
    trainer.train()
    after = trainer.policy.trainable_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train_units" in r]
    assert len(rows) == 2 and all(r["allocation/samples_generated"] > 0 for r in rows)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["samples_generated"] == sum(r["allocation/samples_generated"] for r in rows)


@pytest.mark.slow
def test_pilot_commit_resumes_exactly(tmp_path: Path) -> None:
    overrides = ("train.iterations=3", "allocation.name=pilot_commit")
    straight_and_resumed(lambda: _config(*overrides), tmp_path, stop_after=2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("allocation.name=vigor",), "allocation.name"),
        (
            ("allocation.name=pilot_commit", "train.dynamic_sampling=true"),
            "unset train.dynamic_sampling",
        ),
        (
            ("allocation.name=pilot_commit", "allocation.pilot_commit.pilot_samples=1"),
            "pilot_samples must be >= 2",
        ),
        (
            ("allocation.name=sorted_groups", "allocation.sorted_groups.min_group_size=1"),
            "2 <= min_group_size",
        ),
    ],
)
def test_bad_settings_are_one_line(overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(*overrides).validate()


def test_more_than_one_process_and_whole_group_units_are_refused() -> None:
    with pytest.raises(ConfigError, match="one process"):
        _config("allocation.name=pilot_commit").validate(num_processes=2)
    for recipe in ("digits_gdro", "digits_branch_grpo"):
        config = get_recipe(recipe).apply_overrides(["allocation.name=pilot_commit"])
        with pytest.raises(ConfigError, match="whole groups"):
            config.validate()
