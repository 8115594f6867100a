"""The recipe registry: every recipe module's functions under their names (``RECIPES``), and
``get_recipe``. ``genrl/recipes/catalog.py`` names the same recipes without importing torch."""

from __future__ import annotations

import difflib
from collections.abc import Callable

from genrl.config.errors import ConfigError
from genrl.recipes.catalog import DEFAULT_RECIPE
from genrl.recipes.compositional import COMPOSITIONAL_RECIPES
from genrl.recipes.compositional_methods import COMPOSITIONAL_METHOD_RECIPES
from genrl.recipes.diffusion import DIFFUSION_RECIPES
from genrl.recipes.digits import digits_branch_grpo, digits_flow_grpo, digits_flow_grpo_lora
from genrl.recipes.dllm import DLLM_RECIPES
from genrl.recipes.images import IMAGE_RECIPES
from genrl.recipes.masked_images import MASKED_IMAGE_RECIPES
from genrl.recipes.multi_reward import MULTI_REWARD_RECIPES
from genrl.recipes.objectives import OBJECTIVE_RECIPES
from genrl.recipes.qwen_vl import QWEN_VL_RECIPES
from genrl.recipes.qwenimage import QWENIMAGE_RECIPES
from genrl.recipes.replay import REPLAY_RECIPES
from genrl.recipes.text import TEXT_RECIPES
from genrl.recipes.video_digits import VIDEO_RECIPES
from genrl.recipes.video_models import VIDEO_MODEL_RECIPES
from genrl.recipes.vlm import VLM_RECIPES
from genrl.recipes.wan import WAN_RECIPES
from genrl.run.config import TrainConfig

RECIPES: dict[str, Callable[[], TrainConfig]] = {
    "digits_flow_grpo": digits_flow_grpo,
    "digits_flow_grpo_lora": digits_flow_grpo_lora,
    "digits_branch_grpo": digits_branch_grpo,
    **IMAGE_RECIPES,
    **DIFFUSION_RECIPES,
    **QWENIMAGE_RECIPES,
    **WAN_RECIPES,
    **VIDEO_MODEL_RECIPES,
    **OBJECTIVE_RECIPES,
    **TEXT_RECIPES,
    **REPLAY_RECIPES,
    **DLLM_RECIPES,
    **MASKED_IMAGE_RECIPES,
    **QWEN_VL_RECIPES,
    **VIDEO_RECIPES,
    **COMPOSITIONAL_RECIPES,
    **COMPOSITIONAL_METHOD_RECIPES,
    **MULTI_REWARD_RECIPES,
    **VLM_RECIPES,
}


def get_recipe(name: str) -> TrainConfig:
    if name not in RECIPES:
        close = difflib.get_close_matches(name, list(RECIPES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown recipe {name!r}.{hint} Known: {', '.join(RECIPES)}")
    return RECIPES[name]()


__all__ = ["DEFAULT_RECIPE", "RECIPES", "get_recipe"]
