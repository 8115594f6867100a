"""Countdown task: reward cases checked by hand, generator, splits and the shipped tiny LM.

The reward is what GRPO optimises, so its edge cases (reused numbers, division, hostile input)
are pinned here; the asset tests make sure the shipped model loads offline exactly as recorded.
"""

from __future__ import annotations

import builtins
import hashlib
import json
from itertools import product
from pathlib import Path

import pytest
import torch

from tasks.countdown import (
    HELDOUT_PROBLEMS,
    MAX_COMPLETION_CHARS,
    TRAIN_PROBLEMS,
    countdown_reward,
    expressions,
    format_prompt,
    is_correct,
    make_problems,
    parse_equation,
    parse_prompt,
    score,
    split_of,
)

ASSET_DIR = Path(__file__).resolve().parents[1] / "genrl" / "assets" / "countdown_lm"
P = "Use 3 5 7 to make 22:"


@pytest.mark.parametrize(
    ("prompt", "completion", "expected"),
    [
        (P, "3*5+7", 1.0),
        (P, "7+5*3", 1.0),
        (P, " (3*5)+7 ", 1.0),  # redundant parentheses and surrounding space are fine
        (P, "3*5+7<eos>", 1.0),  # decoded without skip_special_tokens
        (P, "3*5+7<eos>junk", 1.0),  # whatever follows <eos> was never part of the answer
        (P, "3 * 5 + 7", 1.0),
        (P, "3+5+7", 0.1),  # wrong value
        (P, "(7-3)*5", 0.1),  # 20, not 22
        (P, "5*5-3", 0.1),  # makes 22 but reuses 5 and leaves out 7
        (P, "15+7", 0.1),  # makes 22 with numbers that were not given
        (P, "3*5+7*1", 0.1),  # an extra number
        (P, "3*5+7=22", 0.0),  # no "=": the completion is the left-hand side only
        (P, "3*5+", 0.0),
        (P, "", 0.0),
        (P, "-3+5*5", 0.0),  # unary minus is not an allowed operation
        (P, "3**5", 0.0),
        (P, "7//3+5", 0.0),
        (P, "03*5+7", 0.0),  # leading zeros do not parse
        (P, "3*5+7\n1+1", 0.0),
        (P, "answer: 3*5+7", 0.0),
        (P, "(" * 40 + "3" + ")" * 40, 0.0),  # too long
        ("Use 8 4 3 to make 6:", "8/4*3", 1.0),  # exact division
        ("Use 7 2 2 to make 7:", "7/2*2", 1.0),  # exact rational arithmetic, no rounding
        ("Use 7 2 1 to make 3:", "7/2*1", 0.1),  # 3.5 is not 3: no rounding
        ("Use 3 3 5 to make 5:", "5/(3-3)", 0.1),  # division by zero: well-formed, wrong
    ],
)
def test_reward_cases(prompt: str, completion: str, expected: float) -> None:
    assert countdown_reward([prompt], [completion]) == [expected]
    assert is_correct(prompt, completion) == (expected == 1.0)


@pytest.mark.parametrize(
    "attack",
    [
        "__import__('os').system('touch pwned')",
        "open('pwned', 'w').write('x')",
        "exec('1')",
        "(lambda: 22)()",
        "[x for x in ()]",
        "3*5+7 if True else 0",
        "1e3",
        "0x16",
    ],
)
def test_unsafe_input_scores_zero_and_never_runs(
    attack: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the reward must never evaluate code")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    assert countdown_reward([P], [attack]) == [0.0]
    assert countdown_reward([P], ["3*5+7"]) == [1.0]  # works without eval/exec
    assert not (tmp_path / "pwned").exists()


def test_reward_batch_kwargs_and_chat_messages() -> None:
    prompts = [P, P, [{"role": "user", "content": P}]]
    completions = ["3*5+7", "x", [{"role": "assistant", "content": "7+3*5"}]]
    assert countdown_reward(prompts, completions, answer=["ignored"] * 3) == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="completions"):
        countdown_reward([P], [])
    with pytest.raises(ValueError, match="Countdown prompt"):
        score("make 22 from 3 5 7", "3*5+7")


def test_prompt_round_trip() -> None:
    assert format_prompt((3, 5, 7), 22) == P
    assert parse_prompt(P) == ((3, 5, 7), 22)
    assert parse_prompt(format_prompt((12, 1, 9), 104)) == ((12, 1, 9), 104)


def test_expressions_match_the_evaluator() -> None:
    for numbers in product((1, 2, 5, 9), repeat=3):
        for text, value in expressions(numbers):
            equation = parse_equation(text)
            assert equation is not None and equation.value == value, text
            assert sorted(equation.numbers) == sorted(numbers), text


def test_generator_is_deterministic_and_valid() -> None:
    problems = make_problems(300, seed=0, split="train")
    assert problems == make_problems(300, seed=0, split="train")
    assert problems != make_problems(300, seed=1, split="train")
    keys = {(tuple(sorted(p.numbers)), p.target) for p in problems}
    assert len(keys) == len(problems)  # distinct
    for p in problems:
        assert len(p.numbers) == 3 and all(1 <= n <= 9 for n in p.numbers)
        assert 1 <= p.target <= 99
        assert is_correct(p.prompt, p.solution), p
        assert len(p.solution) <= MAX_COMPLETION_CHARS
    with pytest.raises(ValueError, match="split"):
        make_problems(1, seed=0, split="test")


def test_splits_are_disjoint() -> None:
    train = make_problems(1000, seed=0, split="train")
    heldout = make_problems(300, seed=0, split="heldout")
    train_keys = {(tuple(sorted(p.numbers)), p.target) for p in train}
    heldout_keys = {(tuple(sorted(p.numbers)), p.target) for p in heldout}
    assert not train_keys & heldout_keys
    assert all(split_of(p.numbers, p.target) == "heldout" for p in heldout)
    # The split ignores the order of the numbers in the prompt.
    assert split_of((7, 3, 5), 22) == split_of((3, 5, 7), 22)


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
def test_split_sizes() -> None:
    """The constants are the splits' sizes: every distinct problem of each split."""
    assert len(make_problems(TRAIN_PROBLEMS, 0, "train")) == TRAIN_PROBLEMS
    assert len(make_problems(HELDOUT_PROBLEMS, 0, "heldout")) == HELDOUT_PROBLEMS
    with pytest.raises(ValueError, match="distinct"):
        make_problems(HELDOUT_PROBLEMS + 1, 0, "heldout")


def test_manifest_matches_shipped_files() -> None:
    manifest = json.loads((ASSET_DIR / "manifest.json").read_text())
    shipped = {p.name for p in ASSET_DIR.iterdir() if p.name != "manifest.json"}
    assert set(manifest["files"]) == shipped
    for name, entry in manifest["files"].items():
        data = (ASSET_DIR / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], name
        assert len(data) == entry["size_bytes"], name
    assert sum(e["size_bytes"] for e in manifest["files"].values()) < 4_000_000
    heldout = manifest["metrics"]["heldout"]
    assert 0.2 <= heldout["greedy_accuracy"] <= 0.7
    assert heldout["pass8"] - heldout["pass1"] >= 0.2


def test_tokenizer_and_model_load_offline() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ASSET_DIR, local_files_only=True)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1)
    assert tokenizer.padding_side == "left"
    text = P + "3*5+7<eos>"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(P) + len("3*5+7") + 1  # one token per character, <eos> is one
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == P + "3*5+7"

    model = AutoModelForCausalLM.from_pretrained(ASSET_DIR, local_files_only=True).eval()
    assert model.config.model_type == "qwen3"
    problems = make_problems(8, seed=0, split="heldout")
    batch = tokenizer([p.prompt for p in problems], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=MAX_COMPLETION_CHARS + 1,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    completions = tokenizer.batch_decode(
        out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
    )
    rewards = countdown_reward([p.prompt for p in problems], completions)
    assert sum(r > 0 for r in rewards) >= 6, completions  # the format has been learnt


@pytest.mark.slow
def test_manifest_metrics_are_what_the_shipped_model_scores() -> None:
    """The held-out figures in the manifest are recomputed from the shipped weights with the
    build script's own evaluation (greedy accuracy, sampled pass@1 and pass@8), not read back."""
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(ASSET_DIR.parents[2] / "scripts"))
    import build_countdown_lm

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(ASSET_DIR, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(ASSET_DIR, local_files_only=True).eval()
    recorded = json.loads((ASSET_DIR / "manifest.json").read_text())["metrics"]["heldout"]
    measured = build_countdown_lm.evaluate(model, tokenizer, "heldout")
    for name, value in recorded.items():  # 200 problems: 0.005 is one problem
        assert measured[name] == pytest.approx(value, abs=0.011), name
