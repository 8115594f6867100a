"""genrl: reinforcement-learning post-training for generative models through one API.

Quick start::

    from genrl import Trainer, get_recipe

    config = get_recipe("digits_flow_grpo").apply_overrides(["train.iterations=20"])
    summary = Trainer(config, run_dir="runs/demo").train()

Importing ``genrl`` does not import diffusers or transformers.
"""

from genrl.api import GRPOTrainer
from genrl.config import TrainConfig
from genrl.overrides import ConfigError
from genrl.recipes import RECIPES, get_recipe
from genrl.trainer import Trainer

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
