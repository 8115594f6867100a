"""Prompt sources: the training prompts and the held-out evaluation prompts of a run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from genrl.data.rng import Streams, stream_generator
from genrl.prompts.datasets import PromptFileError, read_dataset, read_jsonl
from loading.assets import embedded_asset_path
from tasks.prompt import Prompt, prompt_columns, prompt_id

NO_HELDOUT = "evaluated on training prompts: no held-out set given"
"""The ``heldout`` sentence of a source whose evaluation prompts are its training prompts."""


@dataclass
class PromptSource:
    """Training and held-out prompts, and ``heldout``: one sentence saying how the held-out
    prompts differ from the training ones (reports print it next to every held-out number,
    since "held-out" means something else for each task).

    ``sample(n, seed, iteration)`` draws ``n`` training prompts for one iteration, without
    replacement while ``n`` does not exceed the number of prompts; it depends only on its
    arguments, so resumed and multi-process runs draw the same prompts.
    """

    train: list[str]
    eval: list[str]
    heldout: str = ""

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
    from tasks.digits import ALL_PROMPTS, TRAIN_PROMPTS

    return PromptSource(
        train=list(TRAIN_PROMPTS),
        eval=list(ALL_PROMPTS),
        heldout="10 prompts, one per digit, in a wording no training prompt uses; the model "
        "reads only the digit label, so what is held out for it are the noise seeds",
    )


def _video_digits() -> PromptSource:
    """ "a 3 moving left": every (digit, direction) pair in three templates for training, the
    40 pairs in a fourth template for evaluation."""
    from tasks.video_digits import VIDEO_EVAL_PROMPTS, VIDEO_TRAIN_PROMPTS

    return PromptSource(
        train=list(VIDEO_TRAIN_PROMPTS),
        eval=list(VIDEO_EVAL_PROMPTS),
        heldout="40 prompts, every (digit, direction) pair, in a wording no training prompt "
        "uses; the model reads only the two labels, so what is held out for it are the noise "
        "seeds",
    )


def _compositional() -> PromptSource:
    """The compositional task (``tasks.compositional``): every training
    combination in both templates (430 prompts) for training; for evaluation up to 8 held-out
    combinations per category (25 prompts), none of which any training prompt names."""
    from tasks.compositional import heldout_prompts, train_prompts

    return PromptSource(
        train=train_prompts(),
        eval=heldout_prompts(),
        heldout="25 prompts naming combinations (up to 8 per category) that no training "
        "prompt names",
    )


def _compositional_tuning() -> PromptSource:
    """The compositional task's tuning split (``tasks.compositional``): the training
    combinations that are not validation ones, in both templates (322 prompts), for training;
    up to 8 validation combinations per category (22 prompts) for evaluation. Every prompt names
    a training combination, so a setting chosen on this split has seen no held-out one."""
    from tasks.compositional import tuning_train_prompts, validation_prompts

    return PromptSource(
        train=tuning_train_prompts(),
        eval=validation_prompts(),
        heldout="22 validation prompts: training combinations (up to 8 per category) that no "
        "prompt of this split's training set names; no held-out combination",
    )


def _t2i_simple() -> PromptSource:
    """96 short text-to-image prompts (colour, count, composition, style), 80 train / 16 held
    out; the default prompts of the real-model recipes (replace with your own dataset)."""
    folder = embedded_asset_path("prompts")
    return PromptSource(
        train=read_prompt_file(folder / "t2i_simple_train.txt"),
        eval=read_prompt_file(folder / "t2i_simple_eval.txt"),
        heldout="16 prompts split off the same 96 as the 80 training ones; none is a "
        "training prompt",
    )


def _ocr_simple() -> PromptSource:
    """120 text-rendering prompts (10 scenes x 30 short phrases, shuffled with seed 0), 100 train
    / 20 held out, each quoting the text the ``ocr`` reward reads (the form of Flow-GRPO's
    ``dataset/ocr`` prompts); the default prompts of the OCR recipes."""
    folder = embedded_asset_path("prompts")
    return PromptSource(
        train=read_prompt_file(folder / "ocr_simple_train.txt"),
        eval=read_prompt_file(folder / "ocr_simple_eval.txt"),
        heldout="20 prompts split off the same 120 as the 100 training ones; none is a "
        "training prompt",
    )


def _t2v_simple() -> PromptSource:
    """60 short text-to-video prompts (12 subjects x 8 motions, shuffled), 48 train / 12 held
    out; the default prompts of the Wan recipes (replace with your own dataset)."""
    folder = embedded_asset_path("prompts")
    return PromptSource(
        train=read_prompt_file(folder / "t2v_simple_train.txt"),
        eval=read_prompt_file(folder / "t2v_simple_eval.txt"),
        heldout="12 prompts split off the same 60 as the 48 training ones; none is a "
        "training prompt",
    )


def _countdown() -> PromptSource:
    """Countdown problems: 1,000 training prompts and every held-out problem, 359, whose first
    200 are the ones the embedded model's manifest reports (``make_problems(200, 0,
    "heldout")``: the split is a prefix). All 359 because a gain measured on 200 greedy answers
    has a standard error of about 0.035, a quarter of the 0.15 the recipe is judged by."""
    from tasks.countdown import HELDOUT_PROBLEMS, make_problems

    return PromptSource(
        train=[p.prompt for p in make_problems(1000, 0, "train")],
        eval=[p.prompt for p in make_problems(HELDOUT_PROBLEMS, 0, "heldout")],
        heldout=f"all {HELDOUT_PROBLEMS} problems of the held-out split (a hash of the numbers "
        "and target decides), none of them a training problem",
    )


def _countdown_chat() -> PromptSource:
    """The Countdown problems of ``countdown`` as instructions for chat models."""
    from tasks.countdown import format_chat_prompt, make_problems

    return PromptSource(
        train=[format_chat_prompt(p.numbers, p.target) for p in make_problems(1000, 0, "train")],
        eval=[format_chat_prompt(p.numbers, p.target) for p in make_problems(200, 0, "heldout")],
        heldout="200 problems of the held-out split (a hash of the numbers and target "
        "decides), none of them a training problem",
    )


def _sudoku() -> PromptSource:
    """4x4 Sudoku puzzles: 1,000 training puzzles and the 200 held-out ones the embedded
    dLLM's manifest reports (``make_problems(200, 0, "heldout")``)."""
    from tasks.sudoku import make_problems

    return PromptSource(
        train=[p.prompt for p in make_problems(1000, 0, "train")],
        eval=[p.prompt for p in make_problems(200, 0, "heldout")],
        heldout="200 puzzles of the held-out split (a hash of the solution decides), none of "
        "them a training puzzle",
    )


def _geometry3k() -> PromptSource:
    """Geometry3K as ``scripts/geometry3k_jsonl.py geometry3k`` writes it (in the working
    directory): 2,101 training and 601 test problems with their images and answers."""
    folder = Path("geometry3k")
    train, test = folder / "train.jsonl", folder / "test.jsonl"
    if not (train.is_file() and test.is_file()):
        raise PromptFileError(
            f"prompt set geometry3k reads {train} and {test}: write them once with "
            "`python scripts/geometry3k_jsonl.py geometry3k` (needs the network and the "
            "`datasets` package), or give prompts.dataset=FILE.jsonl"
        )
    return PromptSource(
        train=read_prompt_records(train),
        eval=read_prompt_records(test),
        heldout="the 601 problems of Geometry3K's test split",
    )


def _shapes_vqa() -> PromptSource:
    """Shapes VQA problems (``tasks.shapes``): 4,000 training prompts and 1,000
    held-out problems, whose first 200 are the ones the embedded VLM's manifest reports
    (``make_problems(200, 0, "heldout")``: the split is a prefix). 1,000 because a gain measured
    on 200 greedy answers has a standard error of about 0.035, a third of the 0.1 the recipe is
    judged by. Each prompt carries its picture (``images``) and ``answer``."""
    from tasks.shapes import make_problems

    return PromptSource(
        train=[p.prompt(i) for i, p in enumerate(make_problems(4000, 0, "train"))],
        eval=[p.prompt(i) for i, p in enumerate(make_problems(1000, 0, "heldout"))],
        heldout="1,000 problems of the held-out split (a hash of the scene and question "
        "decides), none of them a training problem",
    )


# Registered prompt sets; a path to a text file works as well (one prompt per line).
PROMPT_SETS: dict[str, Callable[[], PromptSource]] = {
    "digits": _digits,
    "video_digits": _video_digits,
    "compositional": _compositional,
    "compositional_tuning": _compositional_tuning,
    "t2i_simple": _t2i_simple,
    "t2v_simple": _t2v_simple,
    "ocr_simple": _ocr_simple,
    "countdown": _countdown,
    "countdown_chat": _countdown_chat,
    "sudoku": _sudoku,
    "geometry3k": _geometry3k,
    "shapes_vqa": _shapes_vqa,
}


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


def read_prompt_records(path: str | Path, column: str = "prompt") -> list[str]:
    """The prompts of a JSON Lines file: one object per line with the text under ``column``
    and any other columns (``images``: a path or a list of paths, relative to the file;
    ``answer``, ``rubric``, ...) carried by the ``Prompt``, numbered by row (rows may share a
    text: ``prompt_id`` tells them apart)."""
    return read_jsonl(Path(path), column)


def reward_metadata(
    prompts: list[str], per_sample: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]] | None:
    """What a reward gets as ``metadata``: each prompt's dataset columns, updated with the
    rollout's per-sample facts (``completion_length``, ...); None when there are neither."""
    columns = [prompt_columns(p) for p in prompts]
    if per_sample is None and not any(columns):
        return None
    extra = per_sample or [{} for _ in prompts]
    return [{**c, **e} for c, e in zip(columns, extra, strict=True)]


def load_prompts(
    dataset: str, eval_dataset: str | None = None, column: str = "prompt"
) -> PromptSource:
    """Resolve a registered name, a text file (one prompt per line), a dataset file with
    columns (``.jsonl``, ``.csv``, ``.parquet``; the text under ``column``) or a Hugging Face
    dataset (``hf:NAME[:SPLIT]``, or a local folder) into a ``PromptSource``. A file or dataset
    serves as its own held-out set unless ``eval_dataset`` names another."""
    if dataset in PROMPT_SETS:
        source = PROMPT_SETS[dataset]()
    else:
        prompts = read_dataset(dataset, column)
        if prompts is None and Path(dataset).is_file():
            prompts = read_prompt_file(dataset)
        if prompts is None:
            raise ValueError(
                f"prompts.dataset {dataset!r} is neither a registered prompt set "
                f"({', '.join(PROMPT_SETS)}), an existing text, .jsonl, .csv or .parquet file, "
                "a dataset folder, nor an hf:NAME Hugging Face dataset"
            )
        source = PromptSource(train=prompts, eval=prompts, heldout=NO_HELDOUT)
    if eval_dataset is not None:
        source.eval = load_prompts(eval_dataset, column=column).train
        source.heldout = describe_eval_set(source.train, source.eval, eval_dataset)
    elif not source.heldout:  # a set registered without its sentence
        source.heldout = describe_eval_set(source.train, source.eval, f"prompt set {dataset}")
    return source


def describe_eval_set(train: list[str], eval: list[str], name: str) -> str:
    """The ``heldout`` sentence of evaluation prompts that come from ``name``: how many, and
    how many of them are training prompts too (same text and columns, ``prompt_key``)."""
    from genrl.prompts.heldout import shared_prompts

    if eval == train:
        return NO_HELDOUT
    shared = shared_prompts(train, eval)
    if shared == len(eval):
        return f"evaluated on training prompts: all {len(eval)} prompts of {name} are trained on"
    overlap = "none of them" if shared == 0 else f"{shared} of them also"
    return f"the {len(eval)} prompts of {name}, {overlap} a training prompt"


def register_prompt_set(name: str, factory: Callable[[], PromptSource]) -> None:
    """Make ``prompts.dataset=name`` resolve to ``factory()`` (e.g. prompts built in code)."""
    PROMPT_SETS[name] = factory


__all__ = [
    "NO_HELDOUT",
    "PROMPT_SETS",
    "Prompt",
    "PromptFileError",
    "PromptSource",
    "describe_eval_set",
    "load_prompts",
    "prompt_id",
    "read_prompt_records",
    "register_prompt_set",
    "reward_metadata",
]
