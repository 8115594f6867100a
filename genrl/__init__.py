"""genrl: reinforcement-learning post-training for generative models through one API.

Quick start::

    from genrl import Trainer, get_recipe

    config = get_recipe("digits_flow_grpo").apply_overrides(["train.iterations=20"])
    summary = Trainer(config, run_dir="runs/demo").train()

Importing ``genrl`` does not import diffusers or transformers, nor torch: the names below are
imported on first use, so that ``genrl --help`` (whose module lives in this package) answers in
a fraction of a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genrl.api import GRPOTrainer
    from genrl.config.errors import ConfigError
    from genrl.loop.trainer import Trainer
    from genrl.recipes.registry import RECIPES, get_recipe
    from genrl.run.config import TrainConfig

__version__ = "0.1.0"
__all__ = [
    "RECIPES",
    "ConfigError",
    "GRPOTrainer",
    "TrainConfig",
    "Trainer",
    "__version__",
    "get_recipe",
]

# Public name -> the module that defines it.
_LAZY = {
    "GRPOTrainer": "genrl.api",
    "TrainConfig": "genrl.run.config",
    "ConfigError": "genrl.config.errors",
    "RECIPES": "genrl.recipes.registry",
    "get_recipe": "genrl.recipes.registry",
    "Trainer": "genrl.loop.trainer",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (PEP 562)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later accesses skip this function
        return value
    raise AttributeError(f"module 'genrl' has no attribute {name!r}")
