"""The CLI answers at once: ``--help``, argument errors and config errors import no torch,
diffusers or transformers, and the light tables they read (recipes, samplers) name the real
ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from genrl.recipes import DEFAULT_RECIPE as REGISTRY_DEFAULT
from genrl.recipes import RECIPES
from genrl.recipes.catalog import CATALOG, DEFAULT_RECIPE

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "diffusers", "transformers", "accelerate", "peft")

# Runs each argv through genrl.cli.main.main in one fresh interpreter and reports the exit code and
# which heavy modules were imported by then.
_PROBE = """
import json, sys
from genrl.cli.main import main
argv = json.loads(sys.argv[1])
try:
    code = main(argv)
except SystemExit as exit:
    code = exit.code
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"code": code, "heavy": heavy}}))
"""


def _probe(*argv: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), json.dumps(list(argv))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["--help"], 0),
        (["train", "--help"], 0),
        (["sample", "--help"], 0),
        (["train", "--no-such-option"], 2),
        ([], 2),  # no command
        (["train", "digits_flow"], 2),  # a mistyped recipe
        (["recipes"], 2),  # an unknown command, answered with a hint toward `genrl list`
    ],
)
def test_help_and_argument_errors_import_nothing_heavy(argv: list[str], code: int) -> None:
    result = _probe(*argv)
    assert result["code"] == code
    assert result["heavy"] == []


def test_a_mistyped_recipe_gets_a_suggestion_without_torch() -> None:
    result = _probe("train", "digits_flow_grp")
    assert "unknown recipe 'digits_flow_grp'. Did you mean 'digits_flow_grpo'?" in result["stderr"]


def test_the_table_names_every_registered_recipe_function() -> None:
    assert list(CATALOG) == list(RECIPES)
    assert DEFAULT_RECIPE == REGISTRY_DEFAULT
    for name, entry in CATALOG.items():
        function = RECIPES[name]
        assert (entry.module, entry.function) == (function.__module__, function.__name__), name


def test_the_table_flags_agree_with_the_configs() -> None:
    for name, entry in CATALOG.items():
        config = RECIPES[name]()
        from_hub = config.policy.pretrained is not None
        assert entry.needs_download == from_hub, name
        # Every embedded model trains on a CPU; every Hub recipe here is a GPU job.
        assert entry.needs_gpu == from_hub, name
        assert entry.description.endswith(".") and "\n" not in entry.description, name


def test_list_prints_whole_descriptions_and_needs(capsys: pytest.CaptureFixture[str]) -> None:
    from genrl.cli.main import main

    assert main(["list", "--recipes"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # undo the wrapping
    for name, entry in CATALOG.items():
        assert name in out
        assert entry.description in out
    assert "digits_flow_grpo (default) Flow-GRPO" in out
    assert "Flow-GRPO's pickscore_flux settings. [needs GPU + download]" in out
    assert "the default job). [needs" not in out  # the embedded task needs neither


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["train", "--set", "nope=1"],
            "genrl: error: unknown config key 'nope'. Valid keys here: algorithm, allocation, eval,",
        ),
        (
            ["train", "--set", "train.overlap_rewards=yes"],
            "genrl: error: train.overlap_rewards: expected true or false, got 'yes'",
        ),
        (["train", "--set", "optim.lr=fast"], "genrl: error: optim.lr: expected a number, got"),
        (["train", "--set", "optim.lr=nan"], "genrl: error: optim.lr"),
        (
            ["train", "--set", "algorithm.name=grpoo"],
            "genrl: error: algorithm.name: unknown name 'grpoo'. Did you mean 'grpo'?",
        ),
        (
            ["train", "--set", "reward.0.name=pickscor"],
            "genrl: error: reward.0.name: unknown name 'pickscor'. Did you mean 'pickscore'?",
        ),
        (
            ["eval", "--set", "policy.name=sd33"],
            "genrl: error: policy.name: unknown name 'sd33'.",
        ),
        (
            ["train", "--set", "sampler.name=flow_sd"],
            "genrl: error: sampler.name: unknown name 'flow_sd'. Did you mean 'flow_sde'?",
        ),
        (
            ["train", "--set", "sampler.name=flow_ode"],
            "genrl: error: sampler.name='flow_ode' is deterministic",
        ),
        (["train", "--set", "train.iterations=0"], "genrl: error: train.iterations must be >= 1"),
        (
            ["train", "llm_countdown_grpo", "--set", "sampler.num_steps=5"],
            "genrl: error: sampler.num_steps: grpo has no sampler section",
        ),
        (
            ["train", "digits_branch_grpo", "--set", "algorithm.branching=[2,2,4]"],
            "genrl: error: train.group_size (8) must equal the tree's leaves",
        ),
        (
            ["sample", "dllm_sudoku_maskgrpo", "--set", "generation.block_length=7"],
            "genrl: error: generation: completion length",
        ),
    ],
)
def test_config_errors_answer_in_one_line_without_torch(argv: list[str], message: str) -> None:
    """Every mistake in a recipe's config that the config alone shows is reported before the
    command imports torch, in the one line it always had."""
    result = _probe(*argv)
    assert result["code"] == 2
    assert result["heavy"] == []
    lines = result["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result["stderr"]


def test_every_recipe_is_built_and_checked_without_torch() -> None:
    """What the CLI does before torch, for every recipe: build it, apply a ``--set`` and
    validate it; a config module that starts importing torch fails here."""
    script = f"""
import json, sys
from genrl.recipes import RECIPES
for name, recipe in RECIPES.items():
    recipe().apply_overrides(["seed=1"]).validate()
print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def _saved_run(root: Path) -> Path:
    """A run directory as ``--resume`` finds it: the default recipe's ``config.json`` and one
    checkpoint directory (its files are verified only once the run is built)."""
    from genrl.recipes import get_recipe

    run = root / "run"
    (run / "checkpoints" / "iter_000001").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(get_recipe("digits_flow_grpo").to_dict()))
    return run


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--resume", "{run}", "--set", "nope=1"], "unknown config key 'nope'"),
        (
            ["eval", "--checkpoint", "{run}/checkpoints/iter_000001", "--set", "seed=1.5"],
            "seed: expected an integer",
        ),
        (["train", "--resume", "{run}/missing"], "checkpoint path {run}/missing does not exist"),
    ],
)
def test_a_resumed_runs_config_errors_answer_without_torch(
    argv: list[str], message: str, tmp_path: Path
) -> None:
    run = str(_saved_run(tmp_path))
    result = _probe(*(a.format(run=run) for a in argv))
    assert result["code"] == 2
    assert result["heavy"] == []
    lines = result["stderr"].strip().splitlines()
    assert len(lines) == 1 and message.format(run=run) in lines[0], result["stderr"]
