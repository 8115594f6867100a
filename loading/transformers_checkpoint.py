"""The one loader of transformers checkpoints (hub id or ``save_pretrained`` directory), shared
by the token policies (``pipelines/transformers/``) and the judge back-end
(``reward_models/judge_backend.py``), so that both read a checkpoint the same way: the same
Auto classes, the storage dtype by name, ``trust_remote_code`` only when asked, the tokenizer
left-padded, and one-line errors that name the checkpoint.

Each ``load_*`` returns ``(model, tokenizer)`` or ``(model, processor)``; the caller places the
model (device, eval mode, gradients). What differs between callers is only how their settings
are spelled in the errors (``CheckpointHints``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from loading.hub import require_local_or_reachable

_T = TypeVar("_T")

# Storage dtypes by the name a config gives.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class CheckpointHints:
    """How the caller's settings are spelled in the errors.

    Attributes:
        local_dir: the setting that takes a local directory instead of a hub id
            (``require_local_or_reachable``'s ``how_local``).
        trust_remote_code: the setting that allows the checkpoint's own code, e.g.
            ``policy.kwargs.trust_remote_code=true``.
    """

    local_dir: str
    trust_remote_code: str


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (a key of ``DTYPES``); ``ValueError`` otherwise."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def is_vision_language(
    pretrained: str, trust_remote_code: bool, hints: CheckpointHints, what: str = "model"
) -> bool:
    """Whether the checkpoint is a vision-language model: its config has a ``vision_config``
    (LLaVA, Qwen-VL, Gemma 3, Idefics3 do; text LLMs do not)."""
    from transformers import AutoConfig

    def read(remote: dict[str, Any]) -> bool:
        return hasattr(AutoConfig.from_pretrained(pretrained, **remote), "vision_config")

    return _reading(pretrained, trust_remote_code, hints, what, read)


def load_causal_lm(
    pretrained: str,
    dtype: str,
    trust_remote_code: bool,
    hints: CheckpointHints,
    what: str = "causal LM",
) -> tuple[Any, Any]:
    """``(AutoModelForCausalLM, AutoTokenizer)`` of the checkpoint, weights in ``dtype``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    weights = torch_dtype(dtype)

    def read(remote: dict[str, Any]) -> tuple[Any, Any]:
        tokenizer = AutoTokenizer.from_pretrained(pretrained, **remote)
        return AutoModelForCausalLM.from_pretrained(pretrained, dtype=weights, **remote), tokenizer

    model, tokenizer = _reading(pretrained, trust_remote_code, hints, what, read)
    tokenizer.padding_side = "left"  # generation continues, and answers are read at, the end
    return model, tokenizer


def load_vision_language_model(
    pretrained: str,
    dtype: str,
    trust_remote_code: bool,
    hints: CheckpointHints,
    what: str = "VLM",
) -> tuple[Any, Any]:
    """``(AutoModelForImageTextToText, AutoProcessor)`` of the checkpoint, weights in
    ``dtype``; the processor's tokenizer pads on the left."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    weights = torch_dtype(dtype)

    def read(remote: dict[str, Any]) -> tuple[Any, Any]:
        try:
            processor = AutoProcessor.from_pretrained(pretrained, **remote)
        except ImportError as err:
            raise _named_backend(err) from err
        model = AutoModelForImageTextToText.from_pretrained(pretrained, dtype=weights, **remote)
        return model, processor

    model, processor = _reading(pretrained, trust_remote_code, hints, what, read)
    processor.tokenizer.padding_side = "left"  # as for a causal LM: the answer follows the end
    return model, processor


def _named_backend(err: ImportError) -> ImportError:
    """``err`` with the missing library's name, so that the builders' ``missing_extra`` can say
    in one line what to install. transformers refuses a processor whose backend is missing
    with an unnamed ``ImportError`` ("Qwen2VLVideoProcessor requires the Torchvision
    library"): Qwen2-VL's processor (the embedded VLM's included) builds a video processor,
    and every transformers video processor runs on torchvision."""
    if err.name is not None or "torchvision" not in str(err).lower():
        return err
    if importlib.util.find_spec("torchvision") is not None:
        return err
    first_line = (str(err).strip().splitlines() or [""])[0]
    return ModuleNotFoundError(first_line, name="torchvision")


def load_masked_lm(
    pretrained: str,
    dtype: str,
    trust_remote_code: bool,
    hints: CheckpointHints,
    what: str = "masked LM",
) -> tuple[Any, Any]:
    """``(AutoModelForMaskedLM, AutoTokenizer)`` of the checkpoint, weights in ``dtype``; with
    ``trust_remote_code``, ``AutoModel`` when the checkpoint's code registers no masked-LM
    class (LLaDA registers its model for ``AutoModel`` only)."""
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    weights = torch_dtype(dtype)

    def read(remote: dict[str, Any]) -> tuple[Any, Any]:
        tokenizer = AutoTokenizer.from_pretrained(pretrained, **remote)
        try:
            model = AutoModelForMaskedLM.from_pretrained(pretrained, dtype=weights, **remote)
        except ValueError:
            if not trust_remote_code:
                raise
            model = AutoModel.from_pretrained(pretrained, dtype=weights, **remote)
        return model, tokenizer

    model, tokenizer = _reading(pretrained, trust_remote_code, hints, what, read)
    tokenizer.padding_side = "left"  # prompts are left-padded, the completion follows them
    return model, tokenizer


def _reading(
    pretrained: str,
    trust_remote_code: bool,
    hints: CheckpointHints,
    what: str,
    read: Callable[[dict[str, Any]], _T],
) -> _T:
    """``read({"trust_remote_code": ...})`` once the checkpoint is known to be local or
    reachable, its failures as one line: ``cannot load 'X' as a WHAT: <first line>``."""
    # Otherwise an uncached hub id on an offline machine retries for most of a minute.
    require_local_or_reachable(pretrained, hints.local_dir)
    try:
        return read({"trust_remote_code": trust_remote_code})
    except (OSError, ValueError) as err:
        # transformers' messages run to many lines; the first says what went wrong.
        first_line = (str(err).strip().splitlines() or [repr(err)])[0]
        # Missing files and unreachable repositories are OSErrors; an architecture transformers
        # does not know (or code it refuses to run) is a ValueError, where custom code is the
        # likely cause.
        custom = isinstance(err, ValueError) and not trust_remote_code
        hint = f" (custom model code needs {hints.trust_remote_code})" if custom else ""
        raise ValueError(f"cannot load {pretrained!r} as a {what}: {first_line}{hint}") from err


__all__ = [
    "DTYPES",
    "CheckpointHints",
    "is_vision_language",
    "load_causal_lm",
    "load_masked_lm",
    "load_vision_language_model",
    "torch_dtype",
]
