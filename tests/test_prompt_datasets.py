"""Prompt datasets with columns: every format gives the same prompts and the same columns."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from genrl.prompts.sources import PromptFileError, load_prompts, reward_metadata
from tasks.prompt import prompt_columns, prompt_id

ROWS = [
    {"question": "Use 1 2 3 to make 6:", "answer": "6", "level": "easy"},
    {"question": "Use 4 5 6 to make 26:", "answer": "26", "level": "hard"},
    {"question": "Use 4 5 6 to make 26:", "answer": "26", "level": "again"},  # a repeated text
]


def check(prompts: list[str]) -> None:
    assert [str(p) for p in prompts] == [r["question"] for r in ROWS]
    assert [prompt_columns(p) for p in prompts] == [
        {"answer": r["answer"], "level": r["level"]} for r in ROWS
    ]
    assert len({prompt_id(p) for p in prompts}) == 3  # rows sharing a text stay apart


def write_jsonl(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def write_csv(path: Path) -> Path:
    lines = ["question,answer,level"] + [
        f"{r['question']},{r['answer']},{r['level']}" for r in ROWS
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_parquet(path: Path) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), path)
    return path


@pytest.mark.parametrize("writer", [write_jsonl, write_csv, write_parquet])
def test_each_file_format_loads_with_its_columns(writer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    suffix = {write_jsonl: ".jsonl", write_csv: ".csv", write_parquet: ".parquet"}[writer]
    path = writer(tmp_path / f"data{suffix}")
    source = load_prompts(str(path), column="question")
    check(source.train)
    assert source.eval == source.train  # a file is its own held-out set


def test_hugging_face_datasets_load_offline(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    # A folder of data files goes through datasets.load_dataset (the hub loader, offline).
    folder = tmp_path / "hub_like"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl")
    check(load_prompts(f"hf:{folder}", column="question").train)
    check(load_prompts(str(folder), column="question").train)
    # A folder written by save_to_disk, split chosen after the colon.
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:1]), "test": datasets.Dataset.from_list(ROWS)}
    ).save_to_disk(str(saved))
    check(load_prompts(f"hf:{saved}:test", column="question").train)
    assert len(load_prompts(f"hf:{saved}", column="question").train) == 1


def test_an_uncached_hub_dataset_offline_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PromptFileError, match=r"hf:nobody/no-such-dataset.*cannot load it"):
        load_prompts("hf:nobody/no-such-dataset")


def test_columns_reach_reward_functions_as_keyword_arguments(tmp_path: Path) -> None:
    from reward_models import CallableReward

    prompts = load_prompts(str(write_jsonl(tmp_path / "d.jsonl")), column="question").train
    seen = {}

    def reward(prompts, completions, answer, **kwargs):  # type: ignore[no-untyped-def]
        seen.update(kwargs, answer=answer)
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    scores = CallableReward(reward)(["6", "25", "26"], prompts, reward_metadata(prompts))
    assert scores.scores["reward"].tolist() == [1.0, 0.0, 1.0]
    assert seen == {"answer": ["6", "26", "26"], "level": ["easy", "hard", "again"]}


def test_a_missing_prompt_column_names_the_file_and_the_columns(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv")
    with pytest.raises(PromptFileError, match=r"d\.csv: row 1 needs a string 'prompt' column"):
        load_prompts(str(path))
    with pytest.raises(PromptFileError, match=r"its columns: question, answer, level"):
        load_prompts(str(path))
    with pytest.raises(ValueError, match=r"neither a registered prompt set"):
        load_prompts(str(tmp_path / "absent.parquet"))


def test_an_empty_prompt_is_named_by_its_row_or_line(tmp_path: Path) -> None:
    """A blank prompt used to reach the model and fail in torch ("cannot reshape tensor of 0
    elements"); it is refused when the dataset is read."""
    csv_file = tmp_path / "d.csv"
    csv_file.write_text("prompt,answer\nUse 1 2 3 to make 6:,6\n  ,3\n", encoding="utf-8")
    with pytest.raises(PromptFileError) as info:
        load_prompts(str(csv_file))
    assert str(info.value) == (
        f"{csv_file}: row 2 has an empty 'prompt'; give every row a prompt text or drop the row"
    )
    jsonl_file = tmp_path / "d.jsonl"  # a blank line first: the message gives the file's line
    jsonl_file.write_text('\n{"prompt": "a"}\n{"prompt": ""}\n', encoding="utf-8")
    with pytest.raises(PromptFileError) as info:
        load_prompts(str(jsonl_file))
    assert str(info.value) == (
        f'{jsonl_file}: line 3 has an empty "prompt"; give every row a prompt text or drop the row'
    )


def test_a_corrupt_parquet_file_is_named(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(PromptFileError, match=r"broken\.parquet is not a Parquet file"):
        load_prompts(str(path))


def test_missing_optional_readers_name_their_pip_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "d.parquet"
    path.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # importing it now raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(PromptFileError, match=r"Parquet needs pyarrow: pip install pyarrow"):
        load_prompts(str(path))
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(PromptFileError, match=r"needs the datasets package: pip install datasets"):
        load_prompts("hf:someone/prompts")
