"""A compositional recipe on tiny random models (a scene generator of width 32 and a cell scorer
of width 8, saved to a directory): two small iterations in a few seconds, for the smoke tests of
every algorithm that trains on the compositional task."""

from __future__ import annotations

from pathlib import Path

import torch

from genrl import get_recipe
from genrl.run.config import TrainConfig
from pipelines.toy.compositional import CompositionalFlowModel, save_compositional_model
from tasks.compositional_scorer import CellScorer, save_scorer


def tiny_compositional_config(directory: Path, recipe: str, *overrides: str) -> TrainConfig:
    """``recipe`` on tiny random models saved in ``directory`` (partial-credit scores, so that
    small groups differ), then ``overrides``."""
    torch.manual_seed(0)
    flow, scorer = directory / "flow.safetensors", directory / "scorer.safetensors"
    model = CompositionalFlowModel(hidden_dim=32, num_layers=1, text_dim=16, text_layers=1)
    save_compositional_model(model, flow)
    save_scorer(CellScorer(channels=4, hidden_dim=8), scorer)
    config = get_recipe(recipe)
    config.apply_overrides(
        [
            f"policy.pretrained={flow}",
            f'reward.0.kwargs={{"path": "{scorer}", "partial_credit": true}}',
            "train.iterations=2",
            "train.prompts_per_iteration=4",
            "train.group_size=4",
            "train.minibatch_size=16",
            "sampler.num_steps=4",
            "sampler.eval_num_steps=4",
            "eval.samples_per_prompt=1",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
            "logging.log_every=1000",
            "optim.lr=1e-2",
            *overrides,
        ]
    )
    return config
