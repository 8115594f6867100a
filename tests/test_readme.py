"""The Python examples in README.md run as written (the training one shortened)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


COMMANDS = [
    line.split("#")[0].strip()
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    for line in block.splitlines()
    if line.startswith("genrl ") and "[" not in line  # not the synopsis lines
]


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_commands_parse_and_their_recipes_validate(command: str) -> None:
    """Every concrete `genrl ...` command in the README parses, names a registered recipe, and
    its overrides apply to that recipe and validate (without loading any model)."""
    import shlex

    from genrl.cli.main import build_parser
    from genrl.recipes import DEFAULT_RECIPE, RECIPES, get_recipe

    args = build_parser().parse_args(shlex.split(command)[1:])
    if args.command != "train":
        return
    recipe = args.recipe or DEFAULT_RECIPE
    assert recipe in RECIPES, command
    get_recipe(recipe).apply_overrides(args.overrides).validate()


def test_readme_shows_the_commands_and_examples_it_promises() -> None:
    assert len(BLOCKS) >= 2 and len(COMMANDS) >= 10


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
