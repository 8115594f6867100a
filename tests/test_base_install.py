"""The embedded tasks run on README's first install (``pip install -c constraints.txt -e .``, no
extras), and a library that install should hold but lacks is named in one line.

A second virtualenv takes minutes to install, so the base install is emulated in a subprocess:
every package that only an extra brings (read from ``pyproject.toml``) is set to ``None`` in
``sys.modules``, which makes ``import`` fail and ``importlib.util.find_spec`` (what
transformers and accelerate ask before using an optional library) answer "not installed".
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loading.extras import MissingExtraError, missing_extra
from loading.transformers_checkpoint import _named_backend

ROOT = Path(__file__).resolve().parents[1]

# Distribution name (pyproject.toml) -> the top-level modules it installs.
IMPORT_NAMES = {
    "diffusers": ["diffusers"],
    "transformers": ["transformers"],
    "open_clip_torch": ["open_clip"],
    "timm": ["timm"],
    "starlette": ["starlette"],
    "uvicorn": ["uvicorn"],
    "pytest": ["pytest"],
    "hypothesis": ["hypothesis"],
    "scikit-learn": ["sklearn"],
    "mypy": ["mypy"],
    "deepspeed": ["deepspeed"],
    "datasets": ["datasets"],
    "wandb": ["wandb"],
    "gradio_client": ["gradio_client"],
    "orjson": ["orjson"],
    "brotli": ["brotli"],
    "python-multipart": ["multipart", "python_multipart"],
    "trackio": ["trackio"],
    "ruff": ["ruff"],
    "trl": ["trl"],
}
# Not named in pyproject.toml but only there with the extras: what datasets and open_clip pull
# in, and the packages README's test command installs with --no-deps.
BROUGHT_BY_EXTRAS = ["pyarrow", "pandas", "ftfy", "ImageReward", "trackio"]


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]


def extras_only_modules() -> list[str]:
    """The top-level modules of every package an extra adds to the base install."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    names = {
        _requirement_name(r)
        for requirements in project["optional-dependencies"].values()
        for r in requirements
    }
    extra_only = sorted(n for n in names - base if not n.startswith("genrl"))
    unknown = [n for n in extra_only if n not in IMPORT_NAMES]
    assert not unknown, f"add the import names of {unknown} to IMPORT_NAMES"
    return sorted({m for n in extra_only for m in IMPORT_NAMES[n]} | set(BROUGHT_BY_EXTRAS))


def run_hidden(hidden: list[str], argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``genrl ARGV`` in a fresh interpreter in which the ``hidden`` modules are not installed."""
    code = (
        "import sys\n"
        f"for name in {hidden!r}:\n"
        "    sys.modules[name] = None\n"
        "from genrl.cli.main import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )


def test_the_base_install_holds_what_the_embedded_tasks_import() -> None:
    modules = extras_only_modules()
    # The embedded LMs and VLM are transformers checkpoints; the VLM's processor needs
    # torchvision. Both belong to the base install, so the emulation must not hide them.
    assert "transformers" not in modules and "torchvision" not in modules
    assert {"diffusers", "open_clip", "datasets", "sklearn"} <= set(modules)


def test_a_missing_torchvision_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers' own error for the Qwen2-VL processor names no module.
    raw = ImportError(
        "\nQwen2VLVideoProcessor requires the Torchvision library but it was not found in "
        "your environment. Check out the instructions on the\ninstallation page: ..."
    )
    assert raw.name is None and missing_extra(raw, "policy 'shapes_vlm'", "diffusers") is None
    assert _named_backend(raw) is raw  # torchvision is installed here: not the cause
    monkeypatch.setitem(sys.modules, "torchvision", None)
    assert importlib.util.find_spec("torchvision") is None
    named = _named_backend(raw)
    assert named.name == "torchvision"
    missing = missing_extra(named, "policy 'shapes_vlm'", "diffusers")
    assert isinstance(missing, MissingExtraError)
    assert str(missing) == (
        "policy 'shapes_vlm' needs 'torchvision', which is not installed (genrl depends on "
        "it): pip install torchvision (the release paired with your torch; constraints.txt "
        "pins torch 2.14.1 with torchvision 0.29.1)"
    )
    other = ImportError("FooProcessor requires the protobuf library")
    assert _named_backend(other) is other


@pytest.mark.slow
def test_the_vlm_recipe_without_torchvision_fails_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = run_hidden(["torchvision"], ["train", "vlm_shapes_grpo", "--output-dir", str(run)])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("genrl: error: policy 'shapes_vlm' needs 'torchvision'")
    assert not run.exists()  # nothing written before the policy was built


# One recipe per embedded task (README's table "What each embedded task needs"), and the
# VLM's rubric recipe -> overrides that keep one iteration and its evaluations short.
SHORT = {
    "vlm_shapes_grpo": ["train.prompts_per_iteration=2", "train.group_size=2"],
    "vlm_shapes_rubric": ["train.prompts_per_iteration=2", "train.group_size=2"],
    "llm_countdown_grpo": ["train.prompts_per_iteration=2", "train.group_size=2"],
    "dllm_sudoku_maskgrpo": ["train.prompts_per_iteration=2", "train.group_size=2"],
    "video_digits_flow_grpo": ["train.prompts_per_iteration=2", "eval.samples_per_prompt=1"],
    "digits_flow_grpo": ["train.prompts_per_iteration=2", "eval.samples_per_prompt=1"],
    "compositional_flow_grpo": ["train.prompts_per_iteration=2", "eval.samples_per_prompt=1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(SHORT))
def test_embedded_recipe_runs_on_the_base_install(recipe: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    sets = ["train.iterations=1", "logging.progress_bar=false", *SHORT[recipe]]
    argv = ["train", recipe, *(a for s in sets for a in ("--set", s)), "--output-dir", str(run)]
    done = run_hidden(extras_only_modules(), argv)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["recipe"] == recipe and summary["iterations"] == 1
    assert f"outputs in {run}" in done.stdout.splitlines()[-1]
