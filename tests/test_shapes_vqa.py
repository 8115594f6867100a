"""The embedded shapes VQA task: problems by hand, the reward by hand, the shipped tiny Qwen2-VL
against its manifest, GRPO steps on it, and the run report's images."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
import torch

from genrl import Trainer
from genrl.prompts.sources import load_prompts
from genrl.recipes import get_recipe
from genrl.reporting.evaluation import EvalResult
from genrl.reporting.report import save_text_samples
from genrl.run.config import EvalConfig, LoggingConfig, TrainLoopConfig
from pipelines import build_policy
from reward_models import build_reward
from tasks.prompt import Prompt
from tasks.shapes import (
    COLOURS,
    IMAGE_SIZE,
    ask,
    draw,
    make_problems,
    normalise,
    shapes_reward,
    split_of,
)

ASSET_DIR = Path(__file__).resolve().parents[1] / "genrl" / "assets" / "shapes_vlm"


def test_problems_are_deterministic_and_split() -> None:
    first = make_problems(50, seed=3, split="train")
    assert first == make_problems(50, seed=3, split="train")
    assert first[:20] == make_problems(20, seed=3, split="train")
    assert first != make_problems(50, seed=4, split="train")
    heldout = make_problems(50, seed=3, split="heldout")
    assert all(split_of(p.items, p.question) == "heldout" for p in heldout)
    keys = {(tuple(sorted(p.items)), p.question) for p in first}
    assert not keys & {(tuple(sorted(p.items)), p.question) for p in heldout}
    image = first[0].image()
    assert image.size == (IMAGE_SIZE, IMAGE_SIZE) and image.mode == "RGB"
    assert list(first[0].image().getdata()) == list(image.getdata())


def test_heldout_existence_answers_are_balanced() -> None:
    # A constant "yes" or "no" must not beat chance on the held-out existence questions.
    heldout = make_problems(1000, 0, "heldout")
    lead = 0
    for problem in heldout:
        if problem.kind == "exists":
            lead += 1 if problem.answer == "yes" else -1
            assert abs(lead) <= 1
    assert sum(p.kind == "exists" for p in heldout) > 100
    # The training split is drawn as is (the shipped model was pretrained on it): its
    # existence answers are not forced to alternate.
    train = [p.answer for p in make_problems(400, 0, "train") if p.kind == "exists"]
    leads = [sum(1 if a == "yes" else -1 for a in train[: i + 1]) for i in range(len(train))]
    assert max(abs(x) for x in leads) > 1


def test_answers_by_hand() -> None:
    # A red circle top-left, a blue square top-right, a red triangle bottom-right.
    items = (("circle", "red", 0, 0), ("square", "blue", 1, 0), ("triangle", "red", 1, 1))
    rng = random.Random(0)
    assert ask(items, "count", rng) == ("How many shapes?", "3")
    for _ in range(20):
        question, answer = ask(items, "count_colour", rng) or ("", "")
        assert answer == {"red": "2", "blue": "1"}.get(question.split()[2], "0")
        question, answer = ask(items, "count_shape", rng) or ("", "")
        assert answer == "1"  # one circle, one square, one triangle
        # Only "leftmost" (the circle) and "bottom" (the triangle) name one shape.
        asked = ask(items, "colour_at", rng)
        if asked is not None:
            assert asked[1] == "red" and asked[0].split()[4] in ("leftmost", "bottom")
        asked = ask(items, "shape_at", rng)
        if asked is not None:
            expected = {"leftmost": "circle", "bottom": "triangle"}
            assert asked[1] == expected[asked[0].split()[4]]
        question, answer = ask(items, "exists", rng) or ("", "")
        colour, shape = question[len("Is there a ") : -1].split()
        present = {("red", "circle"), ("blue", "square"), ("red", "triangle")}
        assert answer == ("yes" if (colour, shape) in present else "no")
    # The drawing: the middle of the top-left cell is red, of the top-right cell blue.
    image = draw(items, ((0, 0),) * 3)
    assert image.getpixel((8, 8)) == COLOURS["red"]
    assert image.getpixel((24, 8)) == COLOURS["blue"]
    assert image.getpixel((8, 24)) == (255, 255, 255)  # the bottom-left cell is empty


def test_reward_by_hand() -> None:
    assert normalise("  Yes.\nmore") == "yes"
    assert normalise("3 shapes") == "3"
    assert normalise("") == ""
    completions = ["3", "Red", "4", "blah", "no<|im_end|>", ""]
    answers = ["3", "red", "3", "3", "no", "yes"]
    assert shapes_reward(completions, answers) == [1.0, 1.0, 0.1, 0.0, 1.0, 0.0]
    reward = build_reward("shapes_vqa")
    metadata = [{"answer": a} for a in answers]
    out = reward.score(completions, ["q"] * 6, metadata).scores
    assert out["shapes_vqa"].tolist() == pytest.approx([1.0, 1.0, 0.1, 0.0, 1.0, 0.0])
    assert out["accuracy"].tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="answer"):
        reward.score(["3"], ["q"], None)


def test_reward_logs_accuracy_per_kind() -> None:
    """By hand: two exists questions (one right "no", one wrong "yes"), a count right, a count
    wrong; per-kind means over their own samples, NaN and not applicable elsewhere."""
    reward = build_reward("shapes_vqa")
    completions, answers = ["no", "yes", "3", "2"], ["no", "no", "3", "1"]
    kinds = ["exists", "exists", "count", "count_colour"]
    metadata = [{"answer": a, "kind": k} for a, k in zip(answers, kinds, strict=True)]
    out = reward.score(completions, ["q"] * 4, metadata)
    exists = out.scores["accuracy/exists"]
    assert exists[:2].tolist() == [1.0, 0.0] and exists[2:].isnan().all()
    assert float(exists.nanmean()) == 0.5
    assert out.scores["accuracy/count"][2] == 1.0 and out.scores["accuracy/count"][:2].isnan().all()
    assert out.scores["accuracy/count_colour"][3] == 0.0
    says_yes = out.scores["exists/says_yes"]
    assert says_yes[:2].tolist() == [0.0, 1.0] and says_yes[2:].isnan().all()
    assert out.applicable["accuracy/exists"].tolist() == [True, True, False, False]
    assert out.applicable["exists/says_yes"].tolist() == [True, True, False, False]


def test_prompt_set_carries_pictures_and_answers() -> None:
    source = load_prompts("shapes_vqa")
    assert len(source.train) == 4000 and len(source.eval) == 1000
    assert len(set(source.train)) == 4000  # distinct texts: genrl keys prompts by text
    prompt = source.eval[0]
    assert isinstance(prompt, Prompt) and prompt.endswith("(#0)")
    assert prompt.columns["images"][0].size == (IMAGE_SIZE, IMAGE_SIZE)
    assert prompt.columns["answer"] == make_problems(1, 0, "heldout")[0].answer
    # The embedded VLM's manifest reports accuracy on 200 held-out problems: they are the prefix.
    manifest_problems = make_problems(200, 0, "heldout")
    assert [p.columns["answer"] for p in source.eval[:200]] == [p.answer for p in manifest_problems]
    assert list(source.eval[:200]) == [p.prompt(i) for i, p in enumerate(manifest_problems)]


def test_asset_matches_its_manifest() -> None:
    manifest = json.loads((ASSET_DIR / "manifest.json").read_text())
    shipped = {p.name for p in ASSET_DIR.iterdir() if p.name != "manifest.json"}
    assert set(manifest["files"]) == shipped
    for name, entry in manifest["files"].items():
        data = (ASSET_DIR / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], name
        assert len(data) == entry["size_bytes"], name
    assert sum(e["size_bytes"] for e in manifest["files"].values()) < 4_000_000
    assert 0.2 <= manifest["metrics"]["heldout"]["greedy_accuracy"] <= 0.7


def test_shipped_tokenizer_keeps_words_and_special_tokens_whole() -> None:
    """Every answer is one token (then the end token), the chat's special tokens are single
    tokens (``<|im_start|>`` once came out as 12 characters), a word the task never uses still
    tokenizes character by character, and decoding gives the text back."""
    from transformers import AutoProcessor

    from tasks.shapes import ANSWERS

    tokenizer = AutoProcessor.from_pretrained(ASSET_DIR).tokenizer
    for answer in ANSWERS:
        assert len(tokenizer(answer + "<|im_end|>")["input_ids"]) == 2, answer
    text = "<|im_start|>user\nIs there a red square? (#12) hello<|im_end|>"
    ids = tokenizer(text)["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[:3] == ["<|im_start|>", "user", "\n"] and tokens[-1] == "<|im_end|>"
    assert "square" in tokens and tokens[-6:-1] == list("hello")
    assert tokenizer.decode(ids) == text


def test_embedded_policy_answers_in_the_task_format() -> None:
    from samplers.autoregressive import TokenSampler

    policy = build_policy("shapes_vlm")
    assert policy.base_model.config.model_type == "qwen2_vl"
    prompts = [p.prompt(i) for i, p in enumerate(make_problems(16, 0, "heldout"))]
    ids, mask = policy.encode_prompts(prompts)
    out = policy.generate(ids, mask, TokenSampler(0.0), 8, None, policy.model_inputs(prompts))
    texts = policy.decode(out.tokens, out.mask)
    rewards = shapes_reward(texts, [p.columns["answer"] for p in prompts])
    assert sum(r > 0 for r in rewards) >= 14, texts  # the answer format has been learnt


def small_recipe(tmp_path: Path, recipe: str = "vlm_shapes_grpo") -> Trainer:
    config = get_recipe(recipe)
    config.output_dir = str(tmp_path / "run")
    config.train = TrainLoopConfig(
        iterations=2, prompts_per_iteration=4, group_size=4, minibatch_size=8
    )
    config.eval = EvalConfig(samples_per_prompt=1, batch_size=8)
    config.logging = LoggingConfig(tensorboard=False, progress_bar=False, log_every=1000)
    return Trainer(config)


def test_two_grpo_steps_change_the_embedded_model(tmp_path: Path) -> None:
    trainer = small_recipe(tmp_path)
    network = trainer.policy.network
    before = {n: p.detach().clone() for n, p in network.named_parameters() if p.requires_grad}
    assert before
    trainer.train_iteration()
    trainer.train_iteration()
    after = dict(network.named_parameters())
    changed = [n for n, p in before.items() if not torch.equal(p, after[n])]
    assert len(changed) >= 0.5 * len(before)


def test_the_rubric_recipe_logs_every_criterion(tmp_path: Path) -> None:
    """``vlm_shapes_rubric``: the rubric reads each prompt's answer column; every criterion's
    training mean is logged (and drawn in ``score_curves.png`` at the end of a run)."""
    trainer = small_recipe(tmp_path, "vlm_shapes_rubric")
    metrics = trainer.train_iteration()
    for name in ("criterion/answer", "criterion/one_word", "gate_pass", "essential"):
        assert f"rubric/{name}/mean" in metrics
    assert 0.0 <= metrics["rubric/criterion/one_word/mean"] <= 1.0
    # The answer is the only essential criterion: it passes exactly where the gate does.
    assert metrics["rubric/criterion/answer/mean"] == pytest.approx(
        metrics["rubric/gate_pass/mean"]
    )


def test_report_shows_the_pictures(tmp_path: Path) -> None:
    problems = make_problems(3, 0, "heldout")
    prompts = [p.prompt(i) for i, p in enumerate(problems)]
    result = EvalResult(
        reward=0.5,
        per_prompt={p: 0.5 for p in prompts},
        scores={},
        outputs=["3", "red", "yes", "1", "no", "2"],
        prompts=prompts * 2,
    )
    table = tmp_path / "samples_after.md"
    save_text_samples(result, table, "shapes_vqa")
    lines = table.read_text().splitlines()
    assert lines[0] == "| image | prompt | output | mean shapes_vqa of the prompt |"
    assert len(lines) == 2 + 6
    assert lines[2].startswith("| ![image 0](samples_images/samples_after_0_0.png) | ")
    assert lines[5].startswith("| ![image 0](samples_images/samples_after_0_0.png) | ")
    saved = sorted(p.name for p in (tmp_path / "samples_images").iterdir())
    assert saved == [f"samples_after_{i}_0.png" for i in range(3)]
    from PIL import Image

    with Image.open(tmp_path / "samples_images" / saved[0]) as image:
        assert list(image.convert("RGB").getdata()) == list(problems[0].image().getdata())


def test_text_only_report_is_unchanged(tmp_path: Path) -> None:
    result = EvalResult(
        reward=0.5, per_prompt={"a|b": 0.25}, scores={}, outputs=["x\ny"], prompts=["a|b"]
    )
    table = tmp_path / "samples.md"
    save_text_samples(result, table, "r")
    expected = (
        "| prompt | output | mean r of the prompt |\n|---|---|---|\n| a\\|b | x y | 0.250 |\n"
    )
    assert table.read_text() == expected
    assert not (tmp_path / "samples_images").exists()
