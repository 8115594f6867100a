"""The compositional task's grammar, split, requirements and renderer, by hand (no weights)."""

from __future__ import annotations

import random

import pytest
import torch

from genrl.prompts.sources import load_prompts
from tasks.compositional import (
    CATEGORIES,
    CELL,
    COLOURS,
    EVAL_PROMPTS_PER_CATEGORY,
    ObjectSpec,
    Spec,
    all_specs,
    heldout_prompts,
    parse_prompt,
    requirements,
    requirements_met,
    specs_of,
    split_of,
    train_prompts,
)
from tasks.compositional_render import CELLS, cell_labels, render, sample_scene


def test_every_prompt_parses_back_to_its_spec() -> None:
    specs = all_specs()
    assert {s.category for s in specs} == set(CATEGORIES)
    texts = [s.text(t) for s in specs for t in (0, 1)]
    assert len(set(texts)) == len(texts)
    for spec in specs:
        for template in (0, 1):
            assert parse_prompt(spec.text(template)) == spec
    assert parse_prompt("  A Photo of  a RED circle and a blue square.") == Spec(
        "color_attr", (ObjectSpec("circle", "red"), ObjectSpec("square", "blue"))
    )
    assert parse_prompt("three crosses") == Spec("counting", (ObjectSpec("cross", None, 3),))
    assert parse_prompt("a photo of a circle below a cross").relation == "below"


@pytest.mark.parametrize(
    "bad",
    [
        "a photo of a purple circle",  # unknown colour
        "a photo of a hexagon",  # unknown shape
        "five circles",  # unknown number
        "two circles and a square",  # counting names one kind
        "a circle left of a circle",  # a relation takes two different shapes
        "a red circle left of a square",  # ... plain ones
        "a red circle and a red square",  # binding needs two colours
        "a red circle and a square",  # mixed
        "a circle and a square and a cross",
        "a circle left of a square above a cross",
        "",
    ],
)
def test_prompts_outside_the_grammar_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="prompt"):
        parse_prompt(bad)


def test_combination_keys_ignore_word_order() -> None:
    a = parse_prompt("a red circle and a blue square")
    b = parse_prompt("a photo of a blue square and a red circle")
    assert a.key == b.key and a != b
    left = parse_prompt("a circle left of a square")
    assert left.key == parse_prompt("a square right of a circle").key
    assert left.key != parse_prompt("a square left of a circle").key
    assert (
        parse_prompt("a cross above a triangle").key == parse_prompt("a triangle below a cross").key
    )


def test_no_heldout_combination_is_in_a_training_prompt() -> None:
    heldout_keys = {s.key for s in specs_of("heldout")}
    train_keys = {parse_prompt(p).key for p in train_prompts()}
    assert heldout_keys and train_keys
    assert not heldout_keys & train_keys
    # The split is a function of the combination alone: every spelling lands on the same side.
    for spec in all_specs():
        assert spec.split == split_of(spec.key)
    assert {s.key for s in specs_of("train")} | heldout_keys == {s.key for s in all_specs()}
    for category in CATEGORIES:
        sides = {s.split for s in all_specs() if s.category == category}
        assert sides == {"train", "heldout"}, category
    # The held-out combinations per category that the task's docstring and docs state.
    held = [len({s.key for s in specs_of("heldout") if s.category == c}) for c in CATEGORIES]
    assert held == [1, 1, 2, 4, 4, 26]
    with pytest.raises(ValueError, match="split"):
        specs_of("test")


def test_heldout_prompts_cover_every_category_and_feed_the_prompt_set() -> None:
    prompts = heldout_prompts()
    specs = [parse_prompt(p) for p in prompts]
    assert all(s.split == "heldout" for s in specs)
    counts = {c: sum(s.category == c for s in specs) for c in CATEGORIES}
    assert all(1 <= n <= EVAL_PROMPTS_PER_CATEGORY for n in counts.values()), counts
    source = load_prompts("compositional")
    assert source.eval == prompts
    assert source.train == train_prompts()
    assert not {parse_prompt(p).key for p in source.eval} & {
        parse_prompt(p).key for p in source.train
    }


def _scene(*objects: tuple[str, str, int, int]) -> list[tuple[str, str, int, int]]:
    return list(objects)


@pytest.mark.parametrize(
    ("prompt", "scene", "met"),
    [
        ("a circle", _scene(("circle", "red", 0, 0)), [True]),
        ("a circle", _scene(("square", "red", 0, 0)), [False]),
        ("a circle and a cross", _scene(("circle", "red", 0, 0), ("cross", "red", 1, 1)), [1, 1]),
        ("a circle and a cross", _scene(("circle", "red", 0, 0)), [True, False]),
        # Counting is exact, whatever the colours.
        ("two squares", _scene(("square", "red", 0, 0), ("square", "blue", 1, 0)), [True]),
        (
            "two squares",
            _scene(("square", "red", 0, 0), ("square", "blue", 1, 0), ("square", "red", 0, 1)),
            [False],
        ),
        ("a red circle", _scene(("circle", "blue", 0, 0), ("circle", "red", 1, 1)), [True]),
        ("a red circle", _scene(("circle", "blue", 0, 0), ("square", "red", 1, 1)), [False]),
        # Position: columns for left/right, rows for above/below.
        (
            "a circle left of a square",
            _scene(("circle", "red", 0, 1), ("square", "red", 1, 0)),
            [1, 1, 1],
        ),
        (
            "a circle left of a square",
            _scene(("circle", "red", 1, 1), ("square", "red", 0, 0)),
            [1, 1, 0],
        ),
        (
            "a circle left of a square",
            _scene(("circle", "red", 0, 0), ("square", "red", 0, 1)),
            [1, 1, 0],
        ),
        (
            "a circle above a square",
            _scene(("circle", "red", 1, 0), ("square", "red", 0, 1)),
            [1] * 3,
        ),
        (
            "a circle below a square",
            _scene(("circle", "red", 1, 0), ("square", "red", 0, 1)),
            [1, 1, 0],
        ),
        # Attribute binding: swapped colours fail both.
        (
            "a red circle and a blue square",
            _scene(("circle", "blue", 0, 0), ("square", "red", 1, 0)),
            [False, False],
        ),
        (
            "a red circle and a blue square",
            _scene(("circle", "red", 0, 0), ("square", "blue", 1, 0), ("cross", "green", 0, 1)),
            [True, True],
        ),
    ],
)
def test_requirements_by_hand(prompt: str, scene: list, met: list) -> None:
    spec = parse_prompt(prompt)
    assert requirements(spec, scene) == [bool(m) for m in met]
    assert requirements_met(spec, scene) == all(met)


def test_sampled_scenes_meet_their_spec() -> None:
    rng = random.Random(0)
    for spec in all_specs():
        for _ in range(3):
            scene = sample_scene(spec, rng)
            assert requirements_met(spec, scene), (spec, scene)
            assert len({(o[2], o[3]) for o in scene}) == len(scene)


def test_render_puts_each_object_in_its_cell() -> None:
    scenes = [
        [("circle", "red", 0, 0), ("cross", "blue", 1, 1)],
        [],
        [("triangle", "yellow", 1, 0), ("square", "green", 0, 1), ("square", "red", 1, 1)],
    ]
    images = render(scenes, torch.Generator().manual_seed(0))
    assert images.shape == (3, 3, 32, 32)
    assert images.min() >= 0 and images.max() <= 1
    assert images[1].sum() == 0
    again = render(scenes, torch.Generator().manual_seed(0))
    assert torch.equal(images, again)
    shapes, colours = cell_labels(scenes)
    for b in range(len(scenes)):
        for k, (column, row) in enumerate(CELLS):
            cell = images[b, :, row * CELL : (row + 1) * CELL, column * CELL : (column + 1) * CELL]
            # The one-pixel margin stays black, so objects never touch a neighbour.
            assert cell[:, 0].sum() == cell[:, -1].sum() == cell[:, :, 0].sum() == 0
            assert (cell.sum() > 10) == (shapes[b, k] > 0)
            if shapes[b, k] > 0:
                colour = torch.tensor(list(COLOURS.values())[int(colours[b, k])])
                mean = cell.sum(dim=(1, 2)) / cell.max(dim=0).values.gt(0.5).sum()
                assert torch.cosine_similarity(mean, colour, dim=0) > 0.98
    with pytest.raises(ValueError, match="one cell"):
        render([[("circle", "red", 0, 0), ("square", "red", 0, 0)]], torch.Generator())
    with pytest.raises(ValueError, match="cannot draw"):
        render([[("hexagon", "red", 0, 0)]], torch.Generator())


def test_sample_diversity_by_hand() -> None:
    from reward_models import build_reward

    # Prompt "a": a black and a white image (RMS distance 1). Prompt "b": grey levels 0, 0.5
    # and 0 (distances 0.5, 0 and 0.5). Prompt "c": alone in the batch.
    levels = [0.0, 1.0, 0.0, 0.5, 0.0, 0.0]
    images = torch.tensor(levels)[:, None, None, None].expand(-1, 3, 4, 4)
    out = build_reward("sample_diversity")(images, ["a", "a", "b", "b", "c", "b"])
    scores = out.scores["sample_diversity"]
    assert scores[:2].tolist() == [1.0, 1.0]
    assert scores[[2, 3, 5]].tolist() == pytest.approx([0.25, 0.5, 0.25])
    assert scores[4].isnan()
    assert out.applicable["sample_diversity"].tolist() == [1, 1, 1, 1, 0, 1]
