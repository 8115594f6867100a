"""The replay store (``replay.*``, genrl/loop/replay.py and replay_store.py), ExGRPO's
mixed-policy objective (genrl/objectives/mixed_policy.py) and AR3PO's response reuse: the
bucket weights, draws and trajectory choice by hand, the loss terms by hand, the store's
checkpoint round trip with exact resume, and two-step runs on the embedded Countdown LM."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch

from genrl import get_recipe
from genrl.config.errors import ConfigError
from genrl.loop.replay_store import ReplayStore, StoredCompletion, bucket_counts, bucket_weight
from genrl.loop.trainer import Trainer
from genrl.objectives.mixed_policy import mixed_policy_terms
from genrl.run.config import TrainConfig
from genrl.run.replay_config import ReplayConfig
from tasks.prompt import Prompt, prompt_id
from tests.resume_check import straight_and_resumed, trained_rows

SMALL = (
    "train.prompts_per_iteration=8",
    "train.group_size=4",
    "train.minibatch_size=16",
    "train.inner_epochs=1",
    "eval.every=0",
    "logging.progress_bar=false",
    "logging.log_every=100",
    "logging.report_to=[]",
)


def _config(recipe: str, *overrides: str) -> TrainConfig:
    return get_recipe(recipe).apply_overrides([*SMALL, *overrides])


def _completion(tokens: list[int], log_probs: list[float], **scores: float) -> StoredCompletion:
    lp = torch.tensor(log_probs)
    return StoredCompletion(
        tokens=torch.tensor(tokens),
        trained=len(log_probs),
        log_probs=lp,
        finished=True,
        scores=dict(scores),
        entropy=float(-lp.mean()),
        iteration=0,
    )


def test_bucket_weights_by_hand() -> None:
    root = math.sqrt(2 * math.pi)
    assert bucket_weight(4, 8, "normal") == pytest.approx(1 / root)  # 0.398942
    assert bucket_weight(3, 8, "normal") == pytest.approx(math.exp(-0.5) / root)  # 0.241971
    assert bucket_weight(1, 8, "normal") == pytest.approx(0.0044318, abs=1e-7)
    assert bucket_weight(3, 8, "linear") == 0.375
    assert bucket_weight(2, 8, "sqrt") == 0.5
    assert bucket_weight(3, 8, "linear_clip") == 0.375
    assert bucket_weight(6, 8, "linear_clip") == 0.5


def test_bucket_counts_cap_each_bucket_and_hand_the_excess_on() -> None:
    gen = torch.Generator().manual_seed(0)
    weights = {1: bucket_weight(1, 8, "normal"), 4: bucket_weight(4, 8, "normal")}
    # Bucket 4 is 90x likelier but holds one question: the rest must come from bucket 1.
    for seed in range(20):
        gen.manual_seed(seed)
        assert bucket_counts({1: 5, 4: 1}, weights, 3, gen) == {1: 2, 4: 1}
    # More asked than stored: everything, once.
    assert bucket_counts({1: 1, 4: 1}, weights, 5, gen) == {1: 1, 4: 1}
    assert bucket_counts({1: 0, 4: 0}, weights, 2, gen) == {}


def test_bucket_draws_follow_the_normalised_weights() -> None:
    w3, w4 = bucket_weight(3, 8, "normal"), bucket_weight(4, 8, "normal")
    gen = torch.Generator().manual_seed(1)
    draws = [bucket_counts({3: 50, 4: 50}, {3: w3, 4: w4}, 1, gen) for _ in range(3000)]
    share = sum(3 in d for d in draws) / len(draws)
    assert share == pytest.approx(w3 / (w3 + w4), abs=0.03)  # 0.3775; the draw's std is 0.009


def test_store_buckets_dedupes_retires_and_waits_for_the_start() -> None:
    store = ReplayStore(ReplayConfig(ratio=0.5, start_accuracy=0.35), group_size=4)
    a, b = _completion([5, 6, 2], [-0.1, -0.2, -0.3]), _completion([7, 2], [-1.0, -2.0])
    prompt = Prompt("3 4 5 = 12", row=7)
    store.update(prompt, [True, False, True, False], [a, None, b, None])
    assert store.replayable() == []  # the delayed start is not over: nothing is stored
    store.active = True
    store.update(prompt, [True, False, True, False], [a, None, b, None])
    store.update(prompt, [True, False, False, False], [a, None, None, None])  # a again
    assert store.buckets == {"3 4 5 = 12 #7": 1}  # the latest count
    assert [c.tokens.tolist() for c in store.completions["3 4 5 = 12 #7"]] == [[5, 6, 2], [7, 2]]
    assert store.prompt("3 4 5 = 12 #7").row == 7
    store.update(prompt, [False] * 4, [None] * 4)  # no correct member: nothing changes
    assert store.buckets == {"3 4 5 = 12 #7": 1}
    store.update(prompt, [True] * 4, [a, a, a, a])  # solved: retired for good
    assert store.replayable() == [] and store.retired == {"3 4 5 = 12 #7"}
    store.update(prompt, [True, False, False, False], [b, None, None, None])
    assert store.replayable() == []


def test_lowest_entropy_choice_and_reuse() -> None:
    config = ReplayConfig(ratio=0.5, start_accuracy=None)
    store = ReplayStore(config, group_size=4)
    low, high = _completion([1, 2], [-0.1, -0.3]), _completion([3, 2], [-2.0, -1.0])
    store.update("p", [True, True, False, False], [high, low, None, None])
    gen = torch.Generator().manual_seed(0)
    assert low.entropy == pytest.approx(0.2) and high.entropy == pytest.approx(1.5)
    assert store.choose("p", None, gen) is low  # recorded entropies
    assert store.choose("p", [0.9, 1.1], gen) is high  # the current policy's
    assert store.correct_for_reuse("p", gen) is low  # the latest stored
    assert store.correct_for_reuse("q", gen) is None
    questions = store.draw_questions(4, gen)
    assert questions == ["p"]


def test_store_state_round_trips_through_torch_save() -> None:
    store = ReplayStore(ReplayConfig(ratio=0.5, start_accuracy=None), group_size=4)
    store.update(Prompt("x", {"answer": 3}, 2), [True, False, False, False],
                 [_completion([4, 2], [-0.5, -0.25], countdown=1.0), None, None, None])  # fmt: skip
    store.update("solved", [True] * 4, [None] * 4)
    buffer = io.BytesIO()
    torch.save(store.state_dict(), buffer)
    buffer.seek(0)
    restored = ReplayStore(ReplayConfig(ratio=0.5), group_size=4)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.active and restored.retired == {"solved"}
    assert restored.buckets == store.buckets
    assert restored.prompt("x #2").columns == {"answer": 3}
    (got,), (want,) = restored.completions["x #2"], store.completions["x #2"]
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.log_probs, want.log_probs)
    assert got.scores == {"countdown": 1.0} and got.entropy == want.entropy


def test_mixed_policy_terms_by_hand() -> None:
    log = math.log
    lp = torch.tensor([[log(0.5)], [log(0.5)]])
    old = torch.tensor([[log(0.4)], [log(0.4)]])
    behaviour = torch.tensor([[0.0], [log(0.25)]])
    replayed = torch.tensor([False, True])
    advantages = torch.tensor([1.0, 1.0])
    terms, ratio, shaped = mixed_policy_terms(
        lp, old, behaviour, advantages, replayed, shaping_gamma=0.1, clip_range=None
    )
    # Fresh: -A r = -1.25; replayed: w = 0.5 / 0.25 = 2, -A w / (w + 0.1) = -2 / 2.1.
    assert terms[:, 0].tolist() == pytest.approx([-1.25, -2 / 2.1])
    assert ratio[0, 0] == pytest.approx(1.25) and shaped[1, 0] == pytest.approx(2 / 2.1)
    clipped, _, _ = mixed_policy_terms(
        lp, old, behaviour, advantages, replayed, shaping_gamma=0.1, clip_range=(0.2, 0.2)
    )
    # PPO's max(-A r, -A clip(r)) = max(-1.25, -1.2); the replayed term is never clipped.
    assert clipped[:, 0].tolist() == pytest.approx([-1.2, -2 / 2.1])
    # The shaped term's gradient: d/dlp of -A w/(w + g) = -A g w / (w + g)^2 = -0.2 / 4.41.
    lp.requires_grad_(True)
    terms, _, _ = mixed_policy_terms(
        lp, old, behaviour, advantages, replayed, shaping_gamma=0.1, clip_range=None
    )
    terms[1, 0].backward()
    assert lp.grad is not None and lp.grad[1, 0] == pytest.approx(-0.2 / 4.41)


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.policy.trainable_state_dict().items()}


def test_exgrpo_two_steps_replay_and_train(tmp_path: Path) -> None:
    config = _config("llm_countdown_exgrpo", "train.iterations=2", "replay.start_accuracy=null")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    before = _params(trainer)
    first = trainer.train_iteration()
    batch = trainer.collect()  # iteration 1 replays what iteration 0 stored
    assert first["replay/questions"] > 0 and first["replay/replayed"] == 0
    assert batch.rollout.replayed is not None and int(batch.rollout.replayed.sum()) > 0
    rows = batch.rollout.replayed.nonzero()[:, 0]
    assert torch.all(rows % 4 == 0)  # the first member of its group
    assert torch.all(batch.scores["reward"][rows.cpu()] == 1.0)
    assert batch.extra_metrics["replay/generated"] == 32 - len(rows)
    second = trainer.train_iteration()  # iteration 1 (collected again, with what it stored)
    assert second["replay/replayed"] > 0
    assert second["loss/replay_fraction"] > 0 and 0 < second["loss/replay_shaped_ratio_mean"] < 1
    after = _params(trainer)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) >= 0.9 * len(before)


def test_reuse_puts_a_stored_correct_completion_in_an_all_wrong_group(tmp_path: Path) -> None:
    # success at >= 2 is never reached, so every fresh group counts as all wrong.
    config = _config("llm_countdown_grpo_reuse", "replay.success_threshold=2")
    trainer = Trainer(config, run_dir=tmp_path / "run")
    replay = trainer.collector.replay
    assert replay is not None
    prompts = trainer.collector.draw(0, 0).prompts[::4]
    # Stored with every score the run logs: ``reward`` (the composite, which trains),
    # ``countdown`` and ``countdown/accuracy``.
    scores = {"reward": 1.0, "countdown": 1.0, "countdown/accuracy": 1.0}
    stored = _completion([5, 6], [-0.5, -0.7], **scores)
    replay.store.completions = {prompt_id(p): [stored] for p in prompts}
    before = _params(trainer)
    batch = trainer.collect()
    assert (
        batch.extra_metrics["replay/reused"] == 8 and batch.extra_metrics["replay/generated"] == 32
    )
    assert batch.rollout.replayed.nonzero()[:, 0].tolist() == [4 * g + 3 for g in range(8)]
    assert batch.scores["reward"][3::4].tolist() == [1.0] * 8
    assert bool((batch.advantages[3::4] >= 0).all())  # 1 is the top score: never below the mean
    assert torch.equal(
        batch.rollout.completion_mask[3].cpu()[:3], torch.tensor([True, True, False])
    )
    trainer.train_iteration()
    after = _params(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before)


@pytest.mark.slow
def test_resume_with_a_replay_store_is_exact(tmp_path: Path) -> None:
    overrides = ("train.iterations=4", "replay.start_accuracy=null")
    straight, resumed = straight_and_resumed(
        lambda: _config("llm_countdown_exgrpo", *overrides), tmp_path, stop_after=2
    )
    assert resumed.collector.replay is not None and straight.collector.replay is not None
    assert (
        resumed.collector.replay.state_dict().keys()
        == straight.collector.replay.state_dict().keys()
    )
    assert resumed.collector.replay.store.buckets == straight.collector.replay.store.buckets
    assert any(r["replay/replayed"] > 0 for r in trained_rows(tmp_path / "a"))


@pytest.mark.parametrize(
    ("recipe", "overrides", "message"),
    [
        ("llm_countdown_exgrpo", ("replay.ratio=0",), "set replay.ratio > 0"),
        ("llm_countdown_exgrpo", ("replay.ratio=1.5",), "replay.ratio must be in [0, 1]"),
        ("llm_countdown_grpo_reuse", ("train.dynamic_sampling=true",), "train.dynamic_sampling"),
        ("llm_countdown_grpo_reuse", ("replay.min_correct=0",), "replay.min_correct"),
        ("llm_countdown_exgrpo", ("algorithm.tis_cap=2",), "algorithm.tis_cap"),
        ("dllm_sudoku_maskgrpo", ("replay.reuse_correct=true",), "causal-LM completions"),
        ("llm_countdown_grpo_reuse", ("allocation.name=pilot_commit",), "allocation.name"),
    ],
)
def test_config_errors(recipe: str, overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _config(recipe, *overrides).validate()


def test_replay_keeps_one_process() -> None:
    with pytest.raises(ConfigError, match="one process"):
        _config("llm_countdown_grpo_reuse").validate(num_processes=2)


def test_current_entropy_is_the_policys_mean_token_entropy(tmp_path: Path) -> None:
    trainer = Trainer(_config("llm_countdown_exgrpo"), run_dir=tmp_path / "run")
    replay, policy = trainer.collector.replay, trainer.policy
    assert replay is not None
    prompt = trainer.collector.draw(0, 0).prompts[0]
    ids = policy.tokenizer(["3+4", "4+3*2-1"], add_special_tokens=False)["input_ids"]
    stored = [_completion(i, [-1.0] * len(i)) for i in ids]  # recorded entropy 1 for both
    replay.store.completions[prompt_id(prompt)] = stored
    with torch.no_grad():
        got = replay.entropies(policy, prompt_id(prompt), prompt)
        assert got is not None
        for completion, value in zip(stored, got, strict=True):
            prompt_ids, prompt_mask = policy.encode_prompts([prompt])
            tokens = completion.tokens[None].to(policy.device)
            inputs = torch.cat([prompt_ids, tokens], 1)
            mask = torch.cat([prompt_mask, torch.ones_like(tokens)], 1)
            _, entropy = policy.token_log_probs_and_entropies(inputs, mask, tokens, 1.0)
            assert value == pytest.approx(float(entropy.mean()), rel=1e-5)
    gen = torch.Generator().manual_seed(0)
    lowest = min(range(2), key=lambda i: got[i])
    assert replay.store.choose(prompt_id(prompt), got, gen) is stored[lowest]
