"""4x4 Sudoku task: reward cases checked by hand, generator, splits and the shipped masked LM.

The reward is what MaskGRPO optimises, so its edge cases (givens, short or malformed completions,
left-over mask tokens) are pinned here; the asset tests make sure the shipped model and tokenizer
load offline exactly as recorded and still fill puzzles by iterative unmasking.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from tasks.sudoku import (
    BLANKS,
    COMPLETION_CHARS,
    PROMPT_CHARS,
    completions_of,
    format_prompt,
    is_solved,
    is_valid_grid,
    make_problems,
    parse_prompt,
    score,
    solutions,
    split_of,
    sudoku_reward,
)

ASSET_DIR = Path(__file__).resolve().parents[1] / "genrl" / "assets" / "sudoku_dllm"
# Blanks at cells 2, 4, 6, 9, 13, 15; their digits are 3, 3, 1, 1, 3, 1.
P = "Sudoku 12.4 .4.2 2.43 4.2.:"
S = "1234341221434321"


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (S, 1.0),
        (S + "<eos>junk", 1.0),  # whatever follows <eos> was never part of the answer
        (S + "4444", 1.0),  # characters past the 16th are ignored
        ("1234 3412 2143 4321", 1.0),  # whitespace is dropped before cells are read
        ("xx3x3x1xx1xxx3x1", 1.0),  # givens are not scored, wrong or not
        ("12.4.4.22.434.2.", 0.0),  # copying the prompt earns nothing
        ("1224341221434321", 5 / 6),  # cell 2 wrong
        ("1234341224434122", 3 / 6),  # cells 9, 13 and 15 wrong
        ("1234", 1 / 6),  # short: only cell 2 is there
        ("12343", 2 / 6),
        ("", 0.0),
        ("abcdefghijklmnop", 0.0),
        ("1234<mask>41221434321", 5 / 6),  # a left-over mask is one wrong cell, no shift
        ("1234<pad>41221434321", 5 / 6),
        ("3333333333333333", 3 / 6),  # right where the answer is 3
    ],
)
def test_reward_cases(completion: str, expected: float) -> None:
    assert sudoku_reward([P], [completion]) == [pytest.approx(expected)]
    assert is_solved(P, completion) == (expected == 1.0)


def test_reward_batch_kwargs_chat_and_errors() -> None:
    prompts = [P, P, [{"role": "user", "content": P}]]
    completions = [S, "", [{"role": "assistant", "content": S}]]
    assert sudoku_reward(prompts, completions, solution=["x"] * 3) == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="completions"):
        sudoku_reward([P], [])
    with pytest.raises(ValueError, match="Sudoku prompt"):
        score("Sudoku 12.4 .4.2 2.43:", S)  # three rows
    with pytest.raises(ValueError, match="288 solutions"):
        score("Sudoku .... .... .... ....:", S)
    with pytest.raises(ValueError, match="0 solutions"):
        score("Sudoku 11.. .... .... ....:", S)  # givens break a row
    assert score("Sudoku 1234 3412 2143 4321:", "") == 1.0  # nothing blank: vacuous


def test_prompt_round_trip_and_grids() -> None:
    assert format_prompt("12.4.4.22.434.2.") == P
    assert parse_prompt(P) == ("12.4.4.22.434.2.", S)
    assert len(P) == PROMPT_CHARS and len(S) == COMPLETION_CHARS
    with pytest.raises(ValueError, match="16 characters"):
        format_prompt("12.4")
    grids = solutions()
    assert len(grids) == len(set(grids)) == 288 and all(map(is_valid_grid, grids))
    assert S in grids and not is_valid_grid("1234123412341234")
    assert completions_of("12.4.4.22.434.2.") == (S,)


def test_generated_puzzles_are_unique_and_deterministic() -> None:
    problems = make_problems(300, seed=0, split="train")
    assert problems == make_problems(300, seed=0, split="train")
    assert problems != make_problems(300, seed=1, split="train")
    assert len({p.puzzle for p in problems}) == len(problems)  # distinct
    for p in problems:
        assert completions_of(p.puzzle) == (p.solution,), p  # exactly one solution
        assert BLANKS[0] <= p.blanks <= BLANKS[1]
        assert all(c in (".", s) for c, s in zip(p.puzzle, p.solution, strict=True))
        assert len(p.prompt) == PROMPT_CHARS and parse_prompt(p.prompt) == (p.puzzle, p.solution)
        assert sudoku_reward([p.prompt], [p.solution]) == [1.0]
    assert {p.blanks for p in make_problems(20, seed=0, split="heldout", blanks=12)} == {12}
    with pytest.raises(ValueError, match="split"):
        make_problems(1, seed=0, split="test")


def test_splits_are_disjoint() -> None:
    train = make_problems(1000, seed=0, split="train")
    heldout = make_problems(300, seed=0, split="heldout")
    assert not {p.puzzle for p in train} & {p.puzzle for p in heldout}
    # Held-out puzzles have solution grids no train puzzle has.
    assert not {p.solution for p in train} & {p.solution for p in heldout}
    assert all(split_of(p.solution) == "heldout" for p in heldout)
    assert all(split_of(p.solution) == "train" for p in train)


def test_manifest_matches_shipped_files() -> None:
    manifest = json.loads((ASSET_DIR / "manifest.json").read_text())
    shipped = {p.name for p in ASSET_DIR.iterdir() if p.name != "manifest.json"}
    assert set(manifest["files"]) == shipped
    for name, entry in manifest["files"].items():
        data = (ASSET_DIR / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], name
        assert len(data) == entry["size_bytes"], name
    assert sum(e["size_bytes"] for e in manifest["files"].values()) < 3_000_000
    for steps in ("steps16", "steps8"):  # 1 and 2 tokens unmasked per sampler step
        heldout = manifest["metrics"]["heldout"][steps]
        assert 0.2 <= heldout["greedy_solved"] <= 0.7
        assert heldout["pass8"] - heldout["pass1"] >= 0.2


def test_tokenizer_and_model_load_offline() -> None:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ASSET_DIR, local_files_only=True)
    special = (tokenizer.pad_token_id, tokenizer.mask_token_id, tokenizer.eos_token_id)
    assert special == (0, 1, 2)
    ids = tokenizer(P + S)["input_ids"]
    assert len(ids) == PROMPT_CHARS + COMPLETION_CHARS  # one token per character, no specials
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == P + S
    masked = tokenizer(P + "<mask>" * COMPLETION_CHARS)["input_ids"]
    assert masked[PROMPT_CHARS:] == [tokenizer.mask_token_id] * COMPLETION_CHARS

    model = AutoModelForMaskedLM.from_pretrained(ASSET_DIR, local_files_only=True).eval()
    assert model.config.model_type == "modernbert"
    assert model.config.mask_token_id == tokenizer.mask_token_id
    # Greedy low-confidence unmasking, one token per step (the build script's reference sampler).
    problems = make_problems(8, seed=0, split="heldout")
    prompts = [p.prompt for p in problems]
    x = torch.tensor(tokenizer([p + "<mask>" * COMPLETION_CHARS for p in prompts])["input_ids"])
    with torch.no_grad():
        for _ in range(COMPLETION_CHARS):
            probs = model(input_ids=x).logits[:, PROMPT_CHARS:].softmax(-1)
            confidence, token = probs.max(-1)
            still = x[:, PROMPT_CHARS:] == tokenizer.mask_token_id
            best = torch.where(still, confidence, -1.0).argmax(-1)
            rows = torch.arange(len(prompts))
            x[rows, PROMPT_CHARS + best] = token[rows, best]
    completions = tokenizer.batch_decode(x[:, PROMPT_CHARS:])
    assert all(len(c) == COMPLETION_CHARS and set(c) <= set("1234") for c in completions)
    rewards = sudoku_reward(prompts, completions)
    assert sum(rewards) / len(rewards) >= 0.6, completions  # far above chance (about 0.25)


def test_reward_model_adds_the_solved_bonus() -> None:
    from reward_models import build_reward

    out = build_reward("sudoku", solved_bonus=0.5)([S, "3333333333333333"], [P, P])
    assert out.scores["sudoku"].tolist() == pytest.approx([1.5, 0.5])
    assert out.scores["solved"].tolist() == [1.0, 0.0]


@pytest.mark.slow
def test_manifest_metrics_are_what_the_shipped_model_scores() -> None:
    """The held-out figures in the manifest are recomputed from the shipped weights with the
    build script's own evaluation (16 sampler steps), not read back."""
    import sys

    from transformers import AutoModelForMaskedLM, AutoTokenizer

    sys.path.insert(0, str(ASSET_DIR.parents[2] / "scripts"))
    import build_sudoku_dllm

    tokenizer = AutoTokenizer.from_pretrained(ASSET_DIR, local_files_only=True)
    model = AutoModelForMaskedLM.from_pretrained(ASSET_DIR, local_files_only=True).eval()
    recorded = json.loads((ASSET_DIR / "manifest.json").read_text())["metrics"]["heldout"]
    measured = build_sudoku_dllm.evaluate(model, tokenizer, "heldout", (16,))
    for name, value in recorded["steps16"].items():
        assert measured["steps16"][name] == pytest.approx(value, abs=0.011), name
