"""The Python examples in README.md run as written (the training one shortened)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # runs/ lands in a temporary directory
    code = BLOCKS[index].replace("train.iterations=30", "train.iterations=2")
    code = code.replace('"optim.lr=1e-3"]', '"optim.lr=1e-3", "eval.samples_per_prompt=2"]')
    exec(compile(code, f"README.md example {index}", "exec"), {})
    out = capsys.readouterr().out
    if "ratio exactly 1" in BLOCKS[index]:
        assert "'ratio_min': 1.0" in out and "'ratio_max': 1.0" in out
