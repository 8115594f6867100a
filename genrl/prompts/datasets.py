"""Prompt datasets with columns: JSON Lines, CSV, Parquet and Hugging Face datasets.

Every format becomes the same thing: one ``Prompt`` per row, its text from the prompt column
(``prompts.column``, ``prompt`` by default) and every other column carried along, so that a
reward function receives them as keyword arguments (TRL's convention: ``fn(prompts,
completions, answer=[...], **kwargs)``). Path columns named ``image``/``images`` in a file are
resolved against the file's folder.

``pyarrow`` (Parquet) and ``datasets`` (Hugging Face datasets) are optional; a missing one is
named with its pip command.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tasks.prompt import Prompt

IMAGE_COLUMNS = ("image", "images")
"""Columns of a file dataset that hold image paths, resolved against the file's folder."""

HF_PREFIX = "hf:"
"""``hf:NAME`` or ``hf:NAME:SPLIT``: ``datasets.load_dataset(NAME, split=SPLIT)`` (default
split ``train``); offline (``HF_HUB_OFFLINE=1``) it reads the local cache."""

FILE_SUFFIXES = (".jsonl", ".csv", ".parquet")


class PromptFileError(ValueError):
    """A prompt file that cannot be read as prompts; the message names it (and the row)."""


def prompts_from_rows(
    rows: Iterable[Mapping[str, Any]],
    where: str,
    column: str = "prompt",
    folder: Path | None = None,
) -> list[str]:
    """One ``Prompt`` per row: the text under ``column``, the other columns carried, numbered
    by row (rows may share a text: ``prompt_id`` tells them apart). ``folder`` resolves the
    image path columns of a file."""
    prompts: list[str] = []
    for number, row in enumerate(rows, 1):
        if not isinstance(row, Mapping) or not isinstance(row.get(column), str):
            known = (
                f" (its columns: {', '.join(map(str, row))})" if isinstance(row, Mapping) else ""
            )
            raise PromptFileError(
                f"{where}: row {number} needs a string {column!r} column{known}; name the prompt "
                "column with prompts.column"
            )
        if not row[column].strip():
            # A blank prompt encodes to no tokens, which fails deep inside the model's forward.
            raise PromptFileError(
                f"{where}: row {number} has an empty {column!r}; give every row a prompt text "
                "or drop the row"
            )
        columns = {k: v for k, v in row.items() if k != column}
        if folder is not None:
            for key in IMAGE_COLUMNS:
                if isinstance(columns.get(key), str | list):
                    columns[key] = _resolve_paths(columns[key], folder, f"{where}: row {number}")
        prompts.append(Prompt(row[column], columns, len(prompts)))
    if not prompts:
        raise PromptFileError(f"{where} holds no prompts")
    return prompts


def _resolve_paths(value: Any, folder: Path, where: str) -> Any:
    paths = [value] if isinstance(value, str) else value
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise PromptFileError(f"{where}: image columns must hold a path or a list of paths")
    resolved = [str(folder / p) for p in paths]
    missing = [p for p in resolved if not Path(p).is_file()]
    if missing:
        raise PromptFileError(f"{where}: no such file {missing[0]}")
    return resolved[0] if isinstance(value, str) else resolved


def read_jsonl(path: Path, column: str = "prompt") -> list[str]:
    """A JSON Lines file: one object per line."""

    def rows() -> Iterable[Any]:
        for number, line in enumerate(_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise PromptFileError(f"{path}: line {number} is not JSON ({err.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get(column), str):
                raise PromptFileError(
                    f'{path}: line {number} must be an object with a string "{column}"'
                )
            if not row[column].strip():  # named by its line here, not its row
                raise PromptFileError(
                    f'{path}: line {number} has an empty "{column}"; give every row a prompt '
                    "text or drop the row"
                )
            yield row

    return prompts_from_rows(rows(), str(path), column, path.resolve().parent)


def read_csv(path: Path, column: str = "prompt") -> list[str]:
    """A CSV file with a header row; every value is a string (as CSV stores them)."""
    reader = csv.DictReader(_text(path).splitlines())
    return prompts_from_rows(reader, str(path), column, path.resolve().parent)


def read_parquet(path: Path, column: str = "prompt") -> list[str]:
    """A Parquet file (through pyarrow, which ``datasets`` brings)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PromptFileError(
            f"{path}: reading Parquet needs pyarrow: pip install pyarrow "
            '(or pip install "genrl[datasets]")'
        ) from None
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow's errors name no file
        raise PromptFileError(f"{path} is not a Parquet file ({err})") from None
    return prompts_from_rows(table.to_pylist(), str(path), column, path.resolve().parent)


def read_hf(spec: str, column: str = "prompt") -> list[str]:
    """``hf:NAME[:SPLIT]`` through ``datasets.load_dataset`` (a hub id, from the cache when
    offline, or a local folder of data files), or a folder written by ``save_to_disk``."""
    datasets = _datasets(spec)
    name, _, split = spec.removeprefix(HF_PREFIX).partition(":")
    split = split or "train"
    try:
        if (Path(name) / "dataset_info.json").is_file() or (Path(name) / "state.json").is_file():
            loaded = datasets.load_from_disk(name)
            if isinstance(loaded, datasets.DatasetDict):
                loaded = loaded[split]
        else:
            loaded = datasets.load_dataset(name, split=split)
    except (FileNotFoundError, ValueError, ConnectionError, KeyError) as err:
        raise PromptFileError(
            f"prompts.dataset {spec!r}: cannot load it ({type(err).__name__}: {err}); offline, "
            "a hub dataset must be in the local cache (download it once on a connected machine)"
        ) from None
    return from_dataset(loaded, spec, column)


def from_dataset(dataset: Any, where: str, column: str = "prompt") -> list[str]:
    """The prompts of an in-memory ``datasets.Dataset`` (or any iterable of row dicts)."""
    names = getattr(dataset, "column_names", None)
    if names is not None and column not in names:
        raise PromptFileError(
            f"{where}: no {column!r} column (its columns: {', '.join(names)}); name the prompt "
            "column with prompts.column"
        )
    return prompts_from_rows(dataset, where, column)


def _datasets(spec: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise PromptFileError(
            f"prompts.dataset {spec!r} needs the datasets package: pip install datasets "
            '(or pip install "genrl[datasets]")'
        ) from None
    return datasets


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise PromptFileError(
            f"prompt file {path} is not UTF-8 text (byte {err.start} cannot be decoded)"
        ) from None


READERS = {".jsonl": read_jsonl, ".csv": read_csv, ".parquet": read_parquet}


def read_dataset(spec: str, column: str = "prompt") -> list[str] | None:
    """The prompts of a dataset file (by suffix), an ``hf:`` spec or a folder; None when
    ``spec`` is none of these (a registered name or a plain text file)."""
    if spec.startswith(HF_PREFIX):
        return read_hf(spec, column)
    path = Path(spec)
    if path.is_dir():
        return read_hf(HF_PREFIX + spec, column)
    if path.suffix in READERS and path.is_file():
        return READERS[path.suffix](path, column)
    return None


__all__ = [
    "FILE_SUFFIXES",
    "HF_PREFIX",
    "IMAGE_COLUMNS",
    "PromptFileError",
    "from_dataset",
    "prompts_from_rows",
    "read_csv",
    "read_dataset",
    "read_hf",
    "read_jsonl",
    "read_parquet",
]
