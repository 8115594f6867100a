"""The EasyR1-style math reward by hand, the Geometry3K JSONL writer, and the Qwen2.5-VL recipes
on a tiny Qwen2-VL."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from reward_models import REWARDS, RewardModel, RewardOutput, build_reward
from reward_models.math_answer import FORMAT_INSTRUCTION, answers_match, last_boxed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def test_boxed_answers_and_format_by_hand() -> None:
    reward = build_reward("math_boxed")
    outputs = [
        "<think>angles sum</think> so \\boxed{\\frac{3}{4}}",  # right, formatted
        "<think>x</think>\\boxed{0.75}",  # right as a number
        "the answer is \\boxed{3/4}",  # right, no <think>
        "< think >hmm</ think > \\boxed{ 40^\\circ }",  # spaces around tags, degrees
        "<think>x</think> \\boxed{5}",  # wrong
    ]
    metadata = [{"answer": a} for a in ("3/4", "\\frac{3}{4}", "0.75", "40", "4")]
    out = reward(outputs, ["p"] * 5, metadata)
    assert out.scores["accuracy"].tolist() == [1, 1, 1, 1, 0]
    assert out.scores["format"].tolist() == [1, 1, 0, 1, 1]
    # 0.9 * accuracy + 0.1 * format.
    expected = [1.0, 1.0, 0.9, 1.0, 0.1]
    assert out.scores["math_boxed"].tolist() == pytest.approx(expected)
    with pytest.raises(ValueError, match="'answer' column"):
        reward(outputs[:1], ["p"])


def test_last_boxed_and_grading_edge_cases() -> None:
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{unclosed") is None and last_boxed("no box") is None
    assert answers_match("\\left( 2, 3 \\right)", "(2,3)")
    assert answers_match("\\text{12 cm}", "12cm") and answers_match("-2", "-2.0")
    assert not answers_match("2\\sqrt{2}", "\\sqrt{8}")  # no symbolic algebra (documented)
    assert not answers_match(None, "1") and not answers_match("1/0", "1")


def test_geometry3k_rows_become_jsonl_prompts_with_images(tmp_path: Path) -> None:
    from geometry3k_jsonl import write_jsonl

    from genrl.prompts.sources import load_prompts

    rows = [
        {"problem": "<image>Find x.", "answer": "12", "images": [Image.new("RGB", (20, 16))]},
        {"problem": "<image>Find y.", "answer": "3", "images": Image.new("RGB", (8, 8))},
    ]
    path = write_jsonl(rows, tmp_path, "train")
    first = json.loads(path.read_text().splitlines()[0])
    assert first == {
        "prompt": f"Find x. {FORMAT_INSTRUCTION}",
        "images": ["images/train/0_0.png"],
        "answer": "12",
    }
    prompts = load_prompts(str(path)).train
    assert prompts[1].columns["answer"] == "3"
    assert Image.open(prompts[1].columns["images"][0]).size == (8, 8)


class CompletionLength(RewardModel):
    """Characters in the completion (tests only)."""

    name = "completion_length"
    accepts = ("texts",)

    def score(self, outputs, prompts, metadata) -> RewardOutput:
        return RewardOutput({self.name: torch.tensor([float(len(o)) for o in outputs])})


@pytest.mark.parametrize("name", ["qwen25vl_3b_geo_grpo", "qwen25vl_7b_geo_grpo_lora"])
def test_qwen_vl_recipes_train_on_a_tiny_qwen2_vl(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    """The recipes' settings on a tiny model; a random model never writes a boxed answer, so
    the test scores completions by length (``math_boxed`` is tested above) and takes a visible
    learning rate."""
    from accelerate.state import AcceleratorState
    from geometry3k_jsonl import write_jsonl
    from vision_tiny import build_qwen2_vl

    from genrl import Trainer, get_recipe

    qwen = build_qwen2_vl(tmp_path_factory.mktemp("qwen"))
    rows = [
        {"problem": f"<image>Find x {i}.", "answer": str(i), "images": Image.new("RGB", (16, 16))}
        for i in range(3)
    ]
    data = write_jsonl(rows, tmp_path, "train")
    monkeypatch.setitem(REWARDS, "completion_length", CompletionLength)
    config = get_recipe(name)
    config.reward[0].name, config.reward[0].kwargs = "completion_length", {}
    config.apply_overrides(
        [
            "optim.lr=1e-2",
            f"policy.pretrained={qwen}",
            f"prompts.dataset={data}",
            f"output_dir={tmp_path / 'run'}",
            "policy.dtype=float32",
            "generation.max_new_tokens=4",
            "train.iterations=1",
            "train.prompts_per_iteration=2",
            "train.group_size=3",
            "train.minibatch_size=3",
            "train.gradient_accumulation_steps=1",
            "train.rollout_batch_size=6",
            "eval.samples_per_prompt=1",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
        ]
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        trainer = Trainer(config)
        named = trainer.policy.network.named_parameters()
        before = {n: p.detach().clone() for n, p in named if p.requires_grad}
        # The 3B recipe trains the vision tower too; the LoRA one leaves it frozen.
        vision = any("visual" in n for n in before)
        assert vision == (name == "qwen25vl_3b_geo_grpo")
        metrics = trainer.train_iteration()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert math.isfinite(metrics["loss/total"])
    after = dict(trainer.policy.network.named_parameters())
    assert any(not torch.equal(p, after[n]) for n, p in before.items())
