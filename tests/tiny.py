"""Tiny random stand-ins for the embedded models, so trainer tests do not depend on the shipped
weights (those are covered by test_toy_models.py and the end-to-end test)."""

from __future__ import annotations

from pathlib import Path

import torch

from genrl import get_recipe
from genrl.run.config import TrainConfig
from loading.assets import save_model
from pipelines.toy.models import DigitFlowModel
from tasks.digits import DigitClassifier


def tiny_models(directory: Path) -> tuple[Path, Path]:
    """Save a small random flow model and classifier; returns their paths."""
    torch.manual_seed(0)
    flow, clf = directory / "flow.safetensors", directory / "clf.safetensors"
    if not flow.exists():
        save_model(DigitFlowModel(hidden_dim=64, num_layers=2), flow)
        save_model(DigitClassifier(), clf)
    return flow, clf


def tiny_overrides(directory: Path) -> list[str]:
    """The ``--set`` overrides that shrink the embedded recipe to a few seconds on tiny random
    models saved in ``directory`` (for the CLI; ``tiny_config`` applies them)."""
    flow, clf = tiny_models(directory)
    return [
        f"policy.pretrained={flow}",
        f'reward.0.kwargs={{"path": "{clf}"}}',
        "train.iterations=2",
        "train.prompts_per_iteration=4",
        "train.group_size=4",
        "train.minibatch_size=24",
        "sampler.num_steps=4",
        "eval.samples_per_prompt=2",
        "sampler.eval_num_steps=4",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
        "logging.log_every=1000",
        # A visible step size so that "parameters changed" is unambiguous.
        "optim.lr=1e-2",
    ]


def tiny_config(directory: Path, *overrides: str, recipe: str = "digits_flow_grpo") -> TrainConfig:
    """The embedded recipe shrunk to a few seconds, on tiny random models."""
    config = get_recipe(recipe)
    config.apply_overrides([*tiny_overrides(directory), *overrides])
    return config
