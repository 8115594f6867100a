"""The LTX-Video and HunyuanVideo 1.5 recipes (genrl/recipes/video_models.py): each recipe's
adapter, sampler, algorithm and reward settings, one iteration on the tiny stand-ins with a tiny
CLIP as PickScore on 32 px videos of 5 frames."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from diffusers_tiny_video import build_wan_a14b
from family_table import VIDEO_FAMILIES

from genrl import Trainer, get_recipe
from genrl.recipes.video_models import VIDEO_MODEL_RECIPES

FAMILY = {
    "ltx_video_flow_grpo": "ltx",
    "hunyuan_video15_flow_grpo": "hunyuan_video15",
    "wan22_a14b_flow_grpo": "wan",
}
BUILDERS = {"wan": build_wan_a14b, **{name: f.build for name, f in VIDEO_FAMILIES.items()}}


def test_every_recipe_names_its_family() -> None:
    assert set(FAMILY) == set(VIDEO_MODEL_RECIPES)
    for name, family in FAMILY.items():
        assert get_recipe(name).policy.name == family


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
@pytest.mark.parametrize("name", sorted(VIDEO_MODEL_RECIPES))
def test_video_recipes_train_on_tiny_stand_ins(tmp_path: Path, name: str) -> None:
    from accelerate.state import AcceleratorState
    from diffusers_tiny import build_clip

    family = FAMILY[name]
    directory = BUILDERS[family](tmp_path / family)
    described = VIDEO_FAMILIES.get(family)
    config = get_recipe(name)
    kwargs = {**config.policy.kwargs, **(described.policy if described else {})}
    kwargs.update(height=32, width=32, num_frames=5)
    if family == "wan":
        kwargs["max_sequence_length"] = 16
    inner = {
        **config.reward[0].kwargs["reward"],
        "kwargs": {"model": str(build_clip(tmp_path / "clip"))},
    }
    reward = {**config.reward[0].kwargs, "reward": inner, "frames": [0, 4]}
    config.apply_overrides(
        [
            f"policy.pretrained={directory}",
            f"policy.kwargs={json.dumps(kwargs)}",
            f"reward.0.kwargs={json.dumps(reward)}",
            f"output_dir={tmp_path / 'run'}",
            "sampler.num_steps=4",
            "sampler.eval_num_steps=3",
            "train.iterations=1",
            "train.prompts_per_iteration=2",
            "train.group_size=3",
            "train.gradient_accumulation_steps=1",
            "train.rollout_batch_size=4",
            "eval.samples_per_prompt=1",
            "eval.batch_size=4",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
        ]
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        trainer = Trainer(config)
        if described is not None and described.configure is not None:
            described.configure(trainer.policy.pipe, config.sampler.guidance_scale)
        named = trainer.policy.network.named_parameters()
        before = {n: p.detach().clone() for n, p in named if p.requires_grad}
        metrics = trainer.train_iteration()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    after = dict(trainer.policy.network.named_parameters())
    assert any(not torch.equal(p, after[n]) for n, p in before.items())
    assert math.isfinite(metrics["loss/total"])
