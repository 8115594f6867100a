"""The real-model recipes build and train on tiny stand-ins of their models and rewards."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from diffusers_tiny import build_clip, build_flux, build_sana, build_sd3
from vision_tiny import build_llava, build_tiny_hps

from genrl import get_recipe
from genrl.loop.trainer import Trainer
from genrl.recipes.images import IMAGE_RECIPES
from genrl.recipes.objectives import OBJECTIVE_RECIPES

BUILDERS = {"sd3": build_sd3, "flux": build_flux, "sana": build_sana}


def tiny_image_reward(directory: Path) -> dict[str, object]:
    """A tiny ImageReward checkpoint built by the ``image-reward`` package (the reference)."""
    from image_reward_reference import build_reference, package_available

    if not package_available():
        pytest.skip("needs: pip install --no-deps image-reward==1.5")
    return build_reference(directory)[1]


REAL_MODEL_RECIPES = list(IMAGE_RECIPES) + [
    n for n in OBJECTIVE_RECIPES if not n.startswith("digits")
]


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_MODEL_RECIPES)
def test_recipe_runs_on_tiny_stand_ins(tmp_path: Path, name: str) -> None:
    from accelerate.state import AcceleratorState

    config = get_recipe(name)
    family = config.policy.name
    model = BUILDERS[family](tmp_path / family)
    # The recipe's adapter settings (text length, LoRA init, CFG gradients) at a tiny size.
    kwargs = json.dumps({**config.policy.kwargs, "height": 32, "width": 32})
    if family == "sana":
        kwargs = '{"height": 32, "width": 32, "max_sequence_length": 16}'
    if config.reward[0].name == "hps":
        reward_kwargs = json.dumps(build_tiny_hps(tmp_path / "hps"))
    elif config.reward[0].name == "image_reward":
        reward_kwargs = json.dumps(tiny_image_reward(tmp_path / "image_reward"))
    elif config.reward[0].name == "vqa_score":
        reward_kwargs = json.dumps({"model": str(build_llava(tmp_path / "llava"))})
    else:
        reward_kwargs = json.dumps({"model": str(build_clip(tmp_path / "clip"))})
    group = 3
    if config.algorithm.name == "branch_grpo":  # the group is the tree's leaves
        group = math.prod(config.algorithm.branching)
        config.apply_overrides(["sampler.num_steps=10", "algorithm.train_steps=[0, 1, 2, 3, 4, 5]"])
    if config.train.offline_store:  # GDRO's store: one fill batch in the test's directory
        config.apply_overrides(
            [f"train.offline_store={tmp_path / 'store'}", "train.offline_groups=2"]
        )
    if config.sampler.num_steps > 10:
        config.apply_overrides(["sampler.num_steps=4"])
    config.apply_overrides(
        [
            f"policy.pretrained={model}",
            f"policy.kwargs={kwargs}",
            f"reward.0.kwargs={reward_kwargs}",
            f"output_dir={tmp_path / 'run'}",
            "train.iterations=1",
            "train.prompts_per_iteration=2",
            f"train.group_size={group}",
            "train.gradient_accumulation_steps=1",
            "train.rollout_batch_size=4",
            "eval.samples_per_prompt=1",
            "sampler.eval_num_steps=3",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
        ]
    )
    # The recipe's bf16 autocast needs accelerate's process-wide state set afresh.
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        trainer = Trainer(config)
        trainer.collector.fill_offline_store()
        metrics = trainer.train_iteration()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    if config.algorithm.name in ("flow_grpo", "branch_grpo"):  # on-policy ratio of step log-probs
        assert metrics["loss/first_minibatch_ratio_deviation"] == 0.0
    assert metrics["optimizer_steps"] >= 1
    assert math.isfinite(metrics[f"{config.reward[0].name}/mean"])
    assert math.isfinite(metrics["loss/total"])
