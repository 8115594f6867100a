"""The strict score (``exact``: correct with nothing extra on the canvas) beside GenEval's rule,
on scenes drawn by hand and rendered, and the tuning split of training combinations.

Each scene below is written out object by object ``(shape, colour, column, row)`` so that what
it should score is checked by reading it, not by rerunning the rule under test."""

from __future__ import annotations

import math

import torch

from genrl.prompts.sources import PROMPT_SETS
from reward_models.compositional import CompositionalReward
from tasks.compositional import (
    CATEGORIES,
    heldout_prompts,
    is_validation,
    parse_prompt,
    specs_of,
    train_prompts,
    tuning_train_prompts,
    validation_prompts,
    validation_specs,
)
from tasks.compositional_render import render

# prompt, scene, GenEval-rule score, strict score
CASES: list[tuple[str, list[tuple[str, str, int, int]], float, float]] = [
    # Exactly what is asked: 1 on both.
    ("a photo of a red circle and a blue square",
     [("circle", "red", 0, 0), ("square", "blue", 1, 1)], 1.0, 1.0),
    # One extra object: "at least one of each" still holds (GenEval's rule), exact does not.
    ("a photo of a green square",
     [("square", "green", 0, 0), ("cross", "red", 1, 0)], 1.0, 0.0),
    # Counting counts the named shape only: three squares and a cross meet GenEval's "exactly
    # three squares", but the canvas holds four objects where three are asked for.
    ("a photo of three squares",
     [("square", "red", 0, 0), ("square", "blue", 1, 0), ("square", "green", 0, 1),
      ("cross", "yellow", 1, 1)], 1.0, 0.0),
    # Four squares: wrong under both rules (counting is exact in GenEval too).
    ("a photo of three squares",
     [("square", "red", 0, 0), ("square", "blue", 1, 0), ("square", "green", 0, 1),
      ("square", "yellow", 1, 1)], 0.0, 0.0),
    # The relation met, nothing else: 1 on both; with every cell filled: GenEval 1, strict 0.
    ("a photo of a triangle left of a circle",
     [("triangle", "yellow", 0, 1), ("circle", "green", 1, 1)], 1.0, 1.0),
    ("a photo of a triangle left of a circle",
     [("triangle", "yellow", 0, 1), ("circle", "green", 1, 1), ("square", "red", 0, 0),
      ("cross", "blue", 1, 0)], 1.0, 0.0),
    # A missing object fails both; the wrong colour binding fails both.
    ("a photo of a circle and a cross", [("circle", "red", 0, 0)], 0.0, 0.0),
    ("a photo of a red circle and a blue square",
     [("circle", "blue", 0, 0), ("square", "red", 1, 1)], 0.0, 0.0),
]  # fmt: skip


def _score(strict: bool) -> tuple[list[str], dict[str, torch.Tensor]]:
    prompts = [case[0] for case in CASES]
    images = render([case[1] for case in CASES], torch.Generator().manual_seed(0))
    return prompts, CompositionalReward(strict=strict)(images, prompts).scores


def test_geneval_rule_and_strict_scores_of_rendered_scenes() -> None:
    geneval = [case[2] for case in CASES]
    strict = [case[3] for case in CASES]
    _, scores = _score(strict=False)
    assert scores["compositional"].tolist() == geneval
    assert scores["correct"].tolist() == geneval
    assert scores["exact"].tolist() == strict
    assert scores["objects"].tolist() == [float(len(case[1])) for case in CASES]
    # Trained on the strict score: the primary score is exact; correct still logs GenEval's.
    _, strict_scores = _score(strict=True)
    assert strict_scores["compositional"].tolist() == strict
    assert strict_scores["correct"].tolist() == geneval
    assert strict_scores["exact"].tolist() == strict


def test_per_category_strict_columns_apply_to_their_own_category() -> None:
    prompts, scores = _score(strict=False)
    for category in CATEGORIES:
        for k, prompt in enumerate(prompts):
            mine = parse_prompt(prompt).category == category
            value = scores[f"exact_{category}"][k].item()
            assert math.isnan(value) != mine, (category, prompt)
            if mine:
                assert value == CASES[k][3] and scores[category][k].item() == CASES[k][2]
    # The counting column: GenEval's rule passes the crowded three squares, strict does not.
    counting = scores["exact_counting"]
    assert counting[2].item() == 0.0 and scores["counting"][2].item() == 1.0


# -- the tuning split ----------------------------------------------------------------------------
def test_validation_holds_training_combinations_only() -> None:
    heldout = {s.key for s in specs_of("heldout")}
    validation = {s.key for s in validation_specs()}
    assert validation and not validation & heldout
    assert not any(is_validation(key) for key in heldout)
    # Every validation prompt names a training combination, none a held-out one.
    for prompt in validation_prompts():
        key = parse_prompt(prompt).key
        assert key in validation and key not in heldout, prompt
    assert not {parse_prompt(p).key for p in validation_prompts()} & {
        parse_prompt(p).key for p in heldout_prompts()
    }


def test_tuning_split_partitions_the_training_prompts() -> None:
    tuning = set(tuning_train_prompts())
    validation_keys = {s.key for s in validation_specs()}
    assert not {parse_prompt(p).key for p in tuning} & validation_keys
    # Tuning training + validation specs (both templates) = the training prompts.
    rest = {p for p in train_prompts() if parse_prompt(p).key in validation_keys}
    assert tuning | rest == set(train_prompts()) and not tuning & rest
    # The salt leaves every category training combinations and at least one validation one.
    for category in CATEGORIES:
        assert any(parse_prompt(p).category == category for p in tuning), category
        assert any(s.category == category for s in validation_specs()), category


def test_tuning_prompt_set() -> None:
    source = PROMPT_SETS["compositional_tuning"]()
    assert source.train == tuning_train_prompts() and source.eval == validation_prompts()
    assert len(source.eval) == 22 and len(source.train) == 322
    assert not set(source.eval) & set(PROMPT_SETS["compositional"]().eval)
