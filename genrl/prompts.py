"""Prompt sources: the training prompts and the held-out evaluation prompts of a run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from genrl.rng import Streams, stream_generator


@dataclass
class PromptSource:
    """Training and held-out prompts.

    ``sample(n, seed, iteration)`` draws ``n`` training prompts for one iteration, without
    replacement while ``n`` does not exceed the number of prompts; it depends only on its
    arguments, so resumed and multi-process runs draw the same prompts.
    """

    train: list[str]
    eval: list[str]

    def __post_init__(self) -> None:
        if not self.train:
            raise ValueError("the prompt source has no training prompts")
        if not self.eval:
            raise ValueError("the prompt source has no evaluation prompts")

    def sample(
        self, n: int, seed: int, iteration: int, offset: int = 0, purpose: str = "train"
    ) -> list[str]:
        """Prompts ``offset .. offset + n`` of the iteration's stream of shuffled passes over the
        training prompts (``offset > 0``: the refill rounds of dynamic sampling, which continue
        the stream instead of repeating its first prompts); another ``purpose`` (filling an
        offline store) draws a stream of its own."""
        generator = stream_generator("genrl", purpose, Streams.PROMPTS, seed, iteration)
        order: list[int] = []
        while len(order) < offset + n:
            order.extend(torch.randperm(len(self.train), generator=generator).tolist())
        return [self.train[i] for i in order[offset : offset + n]]


def _digits() -> PromptSource:
    from pipelines.toy.prompts import ALL_PROMPTS, TRAIN_PROMPTS

    return PromptSource(train=list(TRAIN_PROMPTS), eval=list(ALL_PROMPTS))


def _video_digits() -> PromptSource:
    """ "a 3 moving left": every (digit, direction) pair in three templates for training, the
    first template's 40 for evaluation."""
    from pipelines.toy.video_prompts import VIDEO_EVAL_PROMPTS, VIDEO_TRAIN_PROMPTS

    return PromptSource(train=list(VIDEO_TRAIN_PROMPTS), eval=list(VIDEO_EVAL_PROMPTS))


def _t2i_simple() -> PromptSource:
    """96 short text-to-image prompts (colour, count, composition, style), 80 train / 16 held
    out; the default prompts of the real-model recipes (replace with your own dataset)."""
    folder = Path(__file__).resolve().parent / "assets" / "prompts"
    return PromptSource(
        train=read_prompt_file(folder / "t2i_simple_train.txt"),
        eval=read_prompt_file(folder / "t2i_simple_eval.txt"),
    )


def _countdown() -> PromptSource:
    """Countdown problems: 1,000 training prompts and the 200 held-out problems the embedded
    model's manifest reports (``make_problems(200, 0, "heldout")``)."""
    from reward_models.tasks.countdown import make_problems

    return PromptSource(
        train=[p.prompt for p in make_problems(1000, 0, "train")],
        eval=[p.prompt for p in make_problems(200, 0, "heldout")],
    )


def _countdown_chat() -> PromptSource:
    """The Countdown problems of ``countdown`` as instructions for chat models."""
    from reward_models.tasks.countdown import format_chat_prompt, make_problems

    return PromptSource(
        train=[format_chat_prompt(p.numbers, p.target) for p in make_problems(1000, 0, "train")],
        eval=[format_chat_prompt(p.numbers, p.target) for p in make_problems(200, 0, "heldout")],
    )


def _sudoku() -> PromptSource:
    """4x4 Sudoku puzzles: 1,000 training puzzles and the 200 held-out ones the embedded
    dLLM's manifest reports (``make_problems(200, 0, "heldout")``)."""
    from reward_models.tasks.sudoku import make_problems

    return PromptSource(
        train=[p.prompt for p in make_problems(1000, 0, "train")],
        eval=[p.prompt for p in make_problems(200, 0, "heldout")],
    )


# Registered prompt sets; a path to a text file works as well (one prompt per line).
PROMPT_SETS: dict[str, Callable[[], PromptSource]] = {
    "digits": _digits,
    "video_digits": _video_digits,
    "t2i_simple": _t2i_simple,
    "countdown": _countdown,
    "countdown_chat": _countdown_chat,
    "sudoku": _sudoku,
}


class PromptFileError(ValueError):
    """A prompt file that is not text (binary, or not UTF-8); the message names it."""


def read_prompt_file(path: str | Path) -> list[str]:
    """The prompts of a UTF-8 text file, one per line (blank lines and ``#`` comments skipped)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise PromptFileError(
            f"prompt file {path} is not UTF-8 text (byte {err.start} cannot be decoded): "
            "expected one prompt per line"
        ) from None
    if "\x00" in text:  # valid UTF-8, yet binary: NUL never occurs in a text file
        raise PromptFileError(
            f"prompt file {path} is binary (it holds NUL bytes): expected one prompt per line"
        )
    lines = [line.strip() for line in text.splitlines()]
    prompts = [line for line in lines if line and not line.startswith("#")]
    if not prompts:
        raise ValueError(f"prompt file {path} holds no prompts")
    return prompts


def load_prompts(dataset: str, eval_dataset: str | None = None) -> PromptSource:
    """Resolve a registered name or a text file into a ``PromptSource``."""
    if dataset in PROMPT_SETS:
        source = PROMPT_SETS[dataset]()
    elif Path(dataset).is_file():
        prompts = read_prompt_file(dataset)
        source = PromptSource(train=prompts, eval=prompts)
    else:
        raise ValueError(
            f"prompts.dataset {dataset!r} is neither a registered prompt set "
            f"({', '.join(PROMPT_SETS)}) nor an existing text file"
        )
    if eval_dataset is not None:
        source.eval = load_prompts(eval_dataset).train
    return source


def register_prompt_set(name: str, factory: Callable[[], PromptSource]) -> None:
    PROMPT_SETS[name] = factory


__all__ = ["PROMPT_SETS", "PromptFileError", "PromptSource", "load_prompts", "register_prompt_set"]
