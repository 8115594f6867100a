"""The config a command runs, built and checked before the command imports torch: the recipe
(or a run's ``config.json``) with its ``--set`` overrides, validated, and the one-line answer to
a recipe name that does not exist."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from genrl.run.config import TrainConfig


def unknown_recipe(name: str | None) -> str | None:
    """The error for a recipe name that is neither catalogued nor registered (None if fine)."""
    from genrl.recipes.catalog import unknown_recipe_message

    message = None if name is None else unknown_recipe_message(name)
    registry = sys.modules.get("genrl.recipes.registry")  # a recipe registered at run time, if any
    if message is not None and registry is not None and name in registry.RECIPES:
        return None
    return message


def load_config(args: argparse.Namespace, resume_dir: Path | None = None) -> TrainConfig:
    """The named recipe, or without one the config.json of the run ``resume_dir`` belongs to,
    with the ``--set`` overrides applied."""
    from genrl.recipes import DEFAULT_RECIPE, get_recipe
    from genrl.run.config_file import config_from_file

    if resume_dir is not None and args.recipe is None:
        config = config_from_file(run_dir_with_config(resume_dir) / "config.json")
    else:
        config = get_recipe(args.recipe or DEFAULT_RECIPE)
    return config.apply_overrides(args.overrides)


def checked_config(args: argparse.Namespace) -> TrainConfig:
    """The command's config (its recipe or a run's ``config.json``, with ``--set``), validated
    for one process; the Trainer validates it again for the real process count, which only adds
    divisibility checks."""
    source = getattr(args, "resume", None) or getattr(args, "checkpoint", None)
    config = load_config(args, Path(source) if source else None)
    config.validate()
    return config


def run_dir_with_config(path: Path) -> Path:
    """The run directory of ``path`` (a run or one of its checkpoints), which must hold the
    run's config.json."""
    from genrl.checkpoints.paths import CheckpointError, run_dir_of

    run_dir = run_dir_of(path)  # the files are verified once, where they are loaded
    if not (run_dir / "config.json").is_file():
        raise CheckpointError(f"{run_dir} has no config.json; name the recipe explicitly")
    return run_dir
