"""Held-out prompts are held out: no registered prompt set evaluates on a training prompt, and
each says, in one sentence, how its held-out prompts differ."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from genrl.prompts.heldout import heldout_protocol, prompt_key, shared_prompts
from genrl.prompts.sources import NO_HELDOUT, PROMPT_SETS, PromptFileError, load_prompts
from genrl.run.config import TrainConfig
from tasks.prompt import Prompt


@pytest.mark.parametrize("name", sorted(PROMPT_SETS))
def test_every_registered_set_evaluates_on_prompts_training_never_sees(name: str) -> None:
    try:
        source = PROMPT_SETS[name]()
    except PromptFileError as err:  # geometry3k: files written by a script with the network
        pytest.skip(str(err))
    train = {prompt_key(p) for p in source.train}
    shared = [p for p in source.eval if prompt_key(p) in train]
    assert not shared, f"{name}: {len(shared)} eval prompts are training prompts: {shared[:3]}"
    assert source.heldout and source.heldout != NO_HELDOUT
    assert len(source.eval) == len({prompt_key(p) for p in source.eval})  # no repeats either


def test_shapes_texts_repeat_across_splits_but_their_pictures_do_not() -> None:
    """Why prompts are compared with their columns: 63 held-out questions of the shapes task
    have the text of a training question (``"<question> (#index)"``) and another picture."""
    source = PROMPT_SETS["shapes_vqa"]()
    texts = {str(p) for p in source.train}
    assert sum(str(p) in texts for p in source.eval) == 63
    assert shared_prompts(source.train, source.eval) == 0


def test_prompt_keys_compare_text_and_every_column() -> None:
    red, blue = Image.new("RGB", (2, 2), (255, 0, 0)), Image.new("RGB", (2, 2), (0, 0, 255))
    base = Prompt("Find x.", {"images": [red], "answer": "3"}, row=0)
    same = Prompt("Find x.", {"images": [red.copy()], "answer": "3"}, row=9)  # another row
    assert prompt_key(base) == prompt_key(same)
    for other in (
        Prompt("Find x.", {"images": [blue], "answer": "3"}),
        Prompt("Find x.", {"images": [red], "answer": "4"}),
        Prompt("Find y.", {"images": [red], "answer": "3"}),
        "Find x.",  # a plain str has no columns
    ):
        assert prompt_key(other) != prompt_key(base)
    assert shared_prompts([base, "a"], [same, "b", "a"]) == 2


def write(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_user_files_say_whether_they_hold_out_anything(tmp_path: Path) -> None:
    train = write(tmp_path / "train.txt", "a cat", "a dog", "a fox")
    assert load_prompts(str(train)).heldout == NO_HELDOUT
    part = write(tmp_path / "part.txt", "a dog", "an owl")
    assert load_prompts(str(train), str(part)).heldout == (
        f"the 2 prompts of {part}, 1 of them also a training prompt"
    )
    apart = write(tmp_path / "apart.txt", "an owl", "a bee", "an eel")
    assert load_prompts(str(train), str(apart)).heldout == (
        f"the 3 prompts of {apart}, none of them a training prompt"
    )
    inside = write(tmp_path / "inside.txt", "a fox", "a cat")
    assert load_prompts(str(train), str(inside)).heldout == (
        f"evaluated on training prompts: all 2 prompts of {inside} are trained on"
    )


def test_protocol_line_by_hand() -> None:
    config = TrainConfig()
    config.apply_overrides(["eval.samples_per_prompt=3", "eval.seed=5"])
    line = heldout_protocol(config, "5 prompts in a new wording", 5, "greedy decoding")
    assert line == (
        "held-out prompts: 5 prompts in a new wording; seed protocol: 5 prompts x 3 samples per "
        "prompt, eval seed 5, greedy decoding"
    )


def test_token_rollouts_state_their_heldout_sampling() -> None:
    from genrl import get_recipe
    from genrl.rollouts.masked import UnmaskingRollout
    from genrl.rollouts.tokens import AutoregressiveRollout

    config = get_recipe("llm_countdown_grpo")
    assert AutoregressiveRollout(config).evaluation_sampling() == (
        "greedy decoding (the seed does not enter)"
    )
    config.apply_overrides(["generation.eval_temperature=0.7"])
    assert AutoregressiveRollout(config).evaluation_sampling() == (
        "sampling at temperature 0.7, seeded by position"
    )
    config = get_recipe("dllm_sudoku_maskgrpo")
    config.apply_overrides(["generation.max_new_tokens=16", "generation.diffusion_steps=8"])
    config.apply_overrides(["generation.block_length=null", "generation.remasking=random"])
    config.apply_overrides(["generation.eval_temperature=0"])
    assert UnmaskingRollout(config).evaluation_sampling() == (
        "random unmasking of 16 tokens in 8 steps, greedy decoding (the seed does not enter)"
    )
