"""What "held-out" means in a run's reports: the prompt set's own sentence (how its evaluation
prompts differ from the training ones, ``PromptSource.heldout``) and the seed protocol of the
run's evaluation (prompts x samples, seed, sampler), and the prompt comparison behind both."""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from tasks.prompt import prompt_columns


def heldout_protocol(config: Any, heldout: str, num_prompts: int, sampling: str) -> str:
    """One line for ``summary.json`` (``heldout_protocol``), the closing table and report.html:
    the prompt set's ``heldout`` sentence, then the evaluation's seed protocol from
    ``config.eval`` and the rollout's ``evaluation_sampling()`` words, e.g. "10 prompts, ...;
    seed protocol: 10 prompts x 32 samples per prompt, eval seed 1234, the deterministic ODE
    sampler, 10 steps, from seeded noise". The same config gives the same numbers: the line
    says what they are measured on."""
    e = config.eval
    samples = "sample" if e.samples_per_prompt == 1 else "samples"
    return (
        f"held-out prompts: {heldout}; seed protocol: {num_prompts} prompts x "
        f"{e.samples_per_prompt} {samples} per prompt, eval seed {e.seed}, {sampling}"
    )


def run_protocol(trainer: Any) -> str:
    """``heldout_protocol`` of a ``Trainer``: its config, prompt source and rollout."""
    return heldout_protocol(
        trainer.config,
        trainer.prompts.heldout,
        len(trainer.prompts.eval),
        trainer.rollout.evaluation_sampling(),
    )


def evaluates_training_prompts(train: list[str], evaluation: list[str]) -> bool:
    """Whether every evaluation prompt is also a training prompt (``prompt_key``): a prompt
    file or in-memory dataset without a held-out set, evaluated on what it trains on."""
    return shared_prompts(train, evaluation) == len(evaluation)


def evaluated(name: str, on_training_prompts: bool) -> str:
    """How reports name an evaluation's ``name`` (a reward, a score): "held-out countdown", or
    "countdown on the training prompts" when there is no held-out set, so that a number
    measured on the training prompts is never called held-out."""
    return f"{name} on the training prompts" if on_training_prompts else f"held-out {name}"


def prompt_key(prompt: str) -> Hashable:
    """What makes two prompts the same prompt: the text and every dataset column (an image by
    its pixels, a path by its name); the row number is left out, since two datasets number
    their rows on their own."""
    return (str(prompt), _frozen(prompt_columns(prompt)))


def shared_prompts(train: list[str], evaluation: list[str]) -> int:
    """How many of ``evaluation`` are also training prompts (``prompt_key``)."""
    seen = {prompt_key(p) for p in train}
    return sum(prompt_key(p) in seen for p in evaluation)


def _frozen(value: Any) -> Hashable:
    """A hashable stand-in for a column value that compares as the value does."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tobytes") and hasattr(value, "mode") and hasattr(value, "size"):
        # A PIL image: its mode, size and pixels (a digest, so that keys stay small).
        digest = hashlib.sha256(value.tobytes()).hexdigest()
        return ("image", value.mode, tuple(value.size), digest)
    if isinstance(value, Hashable):
        return value
    return repr(value)


__all__ = [
    "evaluated",
    "evaluates_training_prompts",
    "heldout_protocol",
    "prompt_key",
    "run_protocol",
    "shared_prompts",
]
