"""Text rewards (Countdown, DAPO overlong penalty) and the embedded Countdown recipe."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genrl import get_recipe
from reward_models import build_reward


def test_countdown_reward_and_accuracy() -> None:
    prompts = ["Use 3 5 7 to make 22:"] * 3
    output = build_reward("countdown")(["3*5+7", "3+5+7", "3*5+"], prompts)
    assert output.scores["countdown"].tolist() == pytest.approx([1.0, 0.1, 0.0])
    assert output.scores["accuracy"].tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="texts"):
        build_reward("countdown")(torch.zeros(1, 3, 8, 8), prompts[:1])


def test_overlong_penalty_by_hand() -> None:
    penalty = build_reward("overlong_penalty", max_length=10, buffer=4, factor=1.0)
    lengths = [5, 6, 8, 10, 12]
    metadata = [{"completion_length": n} for n in lengths]
    scores = penalty(["x"] * 5, ["p"] * 5, metadata).scores["overlong_penalty"]
    # Free up to 10 - 4 = 6 tokens, then -(n - 6) / 4, floored at -1.
    assert scores.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    # Held-out evaluation has no lengths: no penalty.
    assert penalty(["x"], ["p"]).scores["overlong_penalty"].tolist() == [0.0]
    with pytest.raises(ValueError, match="buffer"):
        build_reward("overlong_penalty", max_length=4, buffer=8)


def test_countdown_recipe_trains_the_embedded_model(tmp_path: Path) -> None:
    from genrl.loop.trainer import Trainer

    config = get_recipe("llm_countdown_grpo")
    config.reward.append(
        type(config.reward[0])(
            name="overlong_penalty", weight=1.0, kwargs={"max_length": 8, "buffer": 2}
        )
    )
    config.apply_overrides(
        [
            f"output_dir={tmp_path}",
            "train.iterations=2",
            "train.prompts_per_iteration=4",
            "train.group_size=4",
            "train.minibatch_size=8",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
        ]
    )
    trainer = Trainer(config)
    before = {n: p.detach().clone() for n, p in trainer.policy.network.named_parameters()}
    metrics = trainer.train_iteration()
    assert metrics["loss/first_minibatch_ratio_deviation"] == 0.0
    assert "overlong_penalty/mean" in metrics and metrics["overlong_penalty/mean"] <= 0
    assert 0 <= metrics["countdown/accuracy/mean"] <= 1
    after = dict(trainer.policy.network.named_parameters())
    assert any(not torch.equal(p, after[n]) for n, p in before.items())


def test_countdown_chat_prompts_and_answer_tags() -> None:
    from genrl.prompts.sources import load_prompts
    from tasks.countdown import parse_prompt

    source = load_prompts("countdown_chat")
    assert len(source.train) == 1000 and len(source.eval) == 200
    prompt = source.eval[0]
    numbers, target = parse_prompt(prompt)
    assert "<answer>" in prompt and str(target) in prompt
    reward = build_reward("countdown", answer_tags=True)
    good = "".join(str(n) + "+" for n in numbers)[:-1]  # a well-formed (maybe wrong) equation
    outputs = [f"<think>try</think><answer>{good}</answer>", good, "<answer>x</answer>"]
    scores = reward(outputs, [prompt] * 3).scores["countdown"].tolist()
    assert scores[0] == pytest.approx(1.0 if sum(numbers) == target else 0.1)
    assert scores[1:] == [0.0, 0.0]
