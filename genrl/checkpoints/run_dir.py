"""One run per run directory: a fresh run refuses a directory that holds another run's files,
unless told to replace them; ``--overwrite`` deletes only what a run writes.

Two runs in one directory used to merge: the old run's later checkpoints sorted after the new
run's (which were then pruned as they were written), ``metrics.jsonl`` interleaved both runs and
``genrl eval --checkpoint DIR`` scored one run while ``summary.json`` described the other.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genrl.run.config import TrainConfig

# What a run writes into its directory (genrl/reporting/report.py, metrics.py, checkpoint.py,
# trainer.py, run_plan.py).
RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "summary.json",
    "reward_curve.png",
    "score_curves.png",
    "samples_before.png",
    "samples_after.png",
    "samples_before_after.png",
    "samples_before.gif",
    "samples_after.gif",
    "samples_before_after.gif",
    "samples_before.md",
    "samples_after.md",
    "per_prompt.txt",
    "report.html",
    "plan.json",  # genrl/loop/run_plan.py PLAN_FILE
)
RUN_FOLDERS = ("checkpoints", "tensorboard", "export", "samples", "wandb", "trackio")
# Any of these marks a directory as holding a run: config.json is the first file a run writes.
MARKERS = ("config.json", "metrics.jsonl", "summary.json", "checkpoints")


# What must agree between a run's config.json and the config that resumes it: the recipe,
# and what shapes the trainable weights and the optimizer state (the training length, the
# learning rate and the like may change on resume).
WEIGHT_KEYS = (
    "policy.name",
    "policy.pretrained",
    "policy.lora_rank",
    "policy.lora_target_modules",
)
RESUME_KEYS = ("recipe", "algorithm.name", *WEIGHT_KEYS)


class RunDirectoryError(ValueError):
    """A fresh run was pointed at a directory that holds another run."""


class OtherRunError(RunDirectoryError):
    """A checkpoint was loaded under a config that differs from its run's in what the
    checkpoint's weights or state depend on."""


def run_markers(run_dir: Path) -> list[str]:
    """The markers of a run found in ``run_dir`` (folders with a trailing ``/``)."""
    if not run_dir.is_dir():  # absent, or os.devnull for commands that write no run
        return []
    found = []
    for name in MARKERS:
        path = run_dir / name
        if path.is_dir():
            found.append(f"{name}/")
        elif path.exists():
            found.append(name)
    return found


def refuse_existing_run(run_dir: Path) -> None:
    """Raise ``RunDirectoryError`` if ``run_dir`` holds a run; say what is there and what to do."""
    found = run_markers(run_dir)
    if found:
        raise RunDirectoryError(
            f"{run_dir} already holds a run ({', '.join(found)}): continue it with --resume "
            f"{run_dir} (Python: resume_from=), or start over with --overwrite (overwrite=True), "
            "which deletes that run's files and keeps any others"
        )


def refuse_other_run(config: TrainConfig, checkpoint: Path, keys: tuple[str, ...]) -> None:
    """Raise ``OtherRunError`` when the ``config.json`` of ``checkpoint``'s run differs from
    ``config`` in ``keys`` (``RESUME_KEYS`` to resume, ``WEIGHT_KEYS`` to load weights only),
    before any model is built: a digits run resumed as ``llm_countdown_grpo`` used to fail
    only after the models had loaded, with a hint about LoRA. Nothing is compared when the run
    has no readable ``config.json`` (a checkpoint copied on its own)."""
    from genrl.checkpoints.checkpoint import run_dir_of
    from genrl.config.overrides import to_dict

    run_dir = run_dir_of(checkpoint)
    try:
        saved = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    wanted = to_dict(config)
    # A key the saved config lacks (written before the field existed) is not compared.
    differing = [
        key
        for key in keys
        if _dotted(saved, key) is not _ABSENT and _dotted(saved, key) != _dotted(wanted, key)
    ]
    if not differing:
        return
    if "recipe" in differing:
        raise OtherRunError(
            f"{run_dir} is a run of recipe {saved.get('recipe')!r}, not {config.recipe!r}: "
            "resume it without naming a recipe (its config.json is used), or start "
            f"{config.recipe} in a directory of its own"
        )
    shown = "; ".join(
        f"{key} {json.dumps(_dotted(saved, key))} there, {json.dumps(_dotted(wanted, key))} here"
        for key in differing
    )
    raise OtherRunError(
        f"the checkpoints of {run_dir} do not fit this config ({shown}): use the run's own "
        "config.json (the CLI does when no recipe is named) or set these keys as the run had them"
    )


_ABSENT = object()


def _dotted(config: Any, key: str) -> Any:
    """The value of a dotted key such as ``policy.name`` in a config dict, ``_ABSENT`` where a
    part is missing."""
    for part in key.split("."):
        if not isinstance(config, dict) or part not in config:
            return _ABSENT
        config = config[part]
    return config


def clear_run(run_dir: Path) -> list[str]:
    """Delete the files and folders a run writes from ``run_dir``; leave everything else.
    Returns the names deleted."""
    removed = []
    for name in (*RUN_FILES, *RUN_FOLDERS):
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def resolve_run_dir(config: TrainConfig, run_dir: str | Path | None = None) -> Path:
    """``run_dir``, else ``config.output_dir``, else a new ``runs/<recipe>-<time>``."""
    return Path(run_dir or config.output_dir or _default_run_dir(config.recipe))


def _default_run_dir(recipe: str) -> Path:
    base = Path("runs") / f"{recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    # Two runs started in the same second get directories of their own.
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path
