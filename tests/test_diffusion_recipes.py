"""The classic-diffusion recipes (``genrl/recipes/diffusion.py``) train two iterations on tiny
stand-ins of their checkpoints (SD / SDXL saved with save_pretrained, loaded through our
loader) and rewards, and change the LoRA."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from diffusers_tiny import build_clip
from diffusers_tiny_unet import build_sd, build_sdxl

from genrl.recipes import get_recipe
from genrl.recipes.diffusion import DIFFUSION_RECIPES, SD15, SDXL_BASE

BUILDERS = {"sd": build_sd, "sdxl": build_sdxl}


def _reward_kwargs(name: str, tmp_path: Path) -> dict[str, object]:
    if name == "image_reward":
        from image_reward_reference import build_reference, package_available

        if not package_available():
            pytest.skip("needs: pip install --no-deps image-reward==1.5")
        return build_reference(tmp_path / "image_reward")[1]
    kwargs: dict[str, object] = {"model": str(build_clip(tmp_path / "clip"))}
    if name == "aesthetic":
        from reward_models.aesthetic import AestheticMLP

        torch.manual_seed(0)
        torch.save(AestheticMLP(16).state_dict(), tmp_path / "head.pth")
        kwargs["head"] = str(tmp_path / "head.pth")
    return kwargs


def test_recipes_name_the_real_checkpoints() -> None:
    assert SD15 == "stable-diffusion-v1-5/stable-diffusion-v1-5"
    assert SDXL_BASE == "stabilityai/stable-diffusion-xl-base-1.0"
    for name in DIFFUSION_RECIPES:
        config = get_recipe(name)
        config.validate()
        assert config.policy.pretrained == (SDXL_BASE if config.policy.name == "sdxl" else SD15)


@pytest.mark.slow  # moved from the fast lane (kept under 3 minutes)
@pytest.mark.parametrize("name", list(DIFFUSION_RECIPES))
def test_recipe_trains_two_iterations_on_tiny_stand_ins(tmp_path: Path, name: str) -> None:
    from accelerate.state import AcceleratorState

    from genrl.loop.trainer import Trainer

    config = get_recipe(name)
    model = BUILDERS[config.policy.name](tmp_path / config.policy.name)
    kwargs = json.dumps({**config.policy.kwargs, "height": 32, "width": 32})
    reward_kwargs = json.dumps(_reward_kwargs(config.reward[0].name, tmp_path))
    config.apply_overrides(
        [
            f"policy.pretrained={model}",
            f"policy.kwargs={kwargs}",
            # fp16 convolutions are not what a CPU test measures; the recipe's dtype runs on GPU.
            "policy.dtype=float32",
            "train.mixed_precision=no",
            f"reward.0.kwargs={reward_kwargs}",
            f"output_dir={tmp_path / 'run'}",
            "sampler.num_steps=3",
            "sampler.eval_num_steps=2",
            "train.iterations=2",
            "train.prompts_per_iteration=2",
            "train.group_size=2",
            "train.gradient_accumulation_steps=1",
            "train.rollout_batch_size=4",
            "eval.samples_per_prompt=1",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
        ]
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        trainer = Trainer(config)
        policy = trainer.policy
        before = {
            n: p.detach().clone() for n, p in policy.network.named_parameters() if p.requires_grad
        }
        first = trainer.train_iteration()
        trainer.train_iteration()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert first["loss/first_minibatch_ratio_deviation"] < 1e-6
    assert math.isfinite(first[f"{config.reward[0].name}/mean"])
    after = dict(policy.network.named_parameters())
    # LoRA's B starts at zero and moves only by gradient (A also moves by weight decay alone).
    lora_b = [n for n in before if "lora_B" in n]
    changed = [n for n in lora_b if not torch.equal(before[n], after[n])]
    if first["reward/std"] == 0:
        # The tiny ImageReward scores every 32 px image alike (BLIP at 224 px on a blurred
        # upscale): zero advantages, so no gradient may reach B.
        assert config.reward[0].name == "image_reward" and not changed
        return
    assert lora_b and len(changed) >= 0.9 * len(lora_b), sorted(set(lora_b) - set(changed))
