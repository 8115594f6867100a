"""Mistakes and environment failures end in one ``genrl: error:`` line and exit code 2: a full
disk, a wrong output path, a bad port, a bad sample count, a damaged ``config.json``, a binary
prompt file, and config values that cannot train (NaN/inf, groups of one, all-zero weights)."""

from __future__ import annotations

import dataclasses
import errno
import json
import socket
import typing
from pathlib import Path
from typing import Any

import pytest
from tiny import tiny_config, tiny_overrides

import genrl.loop.trainer
from genrl import Trainer
from genrl.algorithms import ALGORITHMS
from genrl.cli.main import main
from genrl.config.errors import ConfigError
from genrl.recipes import DEFAULT_RECIPE, get_recipe
from genrl.run.config import TrainConfig, algorithm_config
from genrl.run.config_file import config_from_dict


def _cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("genrl: error: ") and err.count("\n") == 1, err
    return err


def _tiny_args(directory: Path) -> list[str]:
    return [arg for setting in tiny_overrides(directory) for arg in ("--set", setting)]


# -- disk full ------------------------------------------------------------------------------------
def test_full_disk_while_checkpointing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import genrl.checkpoints.checkpoint as ckpt

    real_open = open

    def full_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if Path(file).name == "optimizer.pt":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(ckpt, "open", full_open, raising=False)
    run = tmp_path / "run"
    err = _cli_error(capsys, "train", "--output-dir", str(run), *_tiny_args(tmp_path))
    assert "the disk is full: cannot write " in err
    assert f"{run}/checkpoints/.tmp-iter_000002/optimizer.pt" in err


def test_full_disk_while_logging_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_open = Path.open

    def full_open(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self.name == "metrics.jsonl" and "a" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", full_open)
    run = tmp_path / "run"
    err = _cli_error(capsys, "train", "--output-dir", str(run), *_tiny_args(tmp_path))
    assert f"the disk is full: cannot write {run}/metrics.jsonl" in err


# -- paths, ports, counts -------------------------------------------------------------------------
def test_output_dir_naming_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("x")
    assert "--output-dir" in _cli_error(capsys, "train", "--output-dir", str(file))
    err = _cli_error(capsys, "train", "--output-dir", str(file / "run"))
    assert f"lies below {file}, which is a file" in err


def test_serve_reward_bad_ports(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for port in ("70000", "-1"):
        err = _cli_error(capsys, "serve-reward", "digit_classifier", "--port", port)
        assert "--port must lie in [0, 65535]" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        err = _cli_error(capsys, "serve-reward", "digit_classifier", "--port", port)
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in err

    def refuse(self: socket.socket, address: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(socket.socket, "bind", refuse)
    err = _cli_error(capsys, "serve-reward", "digit_classifier", "--port", "80")
    assert "cannot listen on 127.0.0.1:80: permission denied" in err


@pytest.mark.parametrize("count", ["-3", "0"])
def test_sample_count_must_be_positive(count: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _cli_error(capsys, "sample", "-n", count, "--prompt", "the number 3")
    assert f"-n/--num-per-prompt must be >= 1, got {count}" in err


# -- a damaged config.json on resume ---------------------------------------------------------------
def _run_with_config(tmp_path: Path, text: str) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints" / "iter_000001").mkdir(parents=True)
    (run / "config.json").write_text(text)
    return run


def test_resume_with_invalid_json_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_with_config(tmp_path, '{"seed": 1,')
    err = _cli_error(capsys, "train", "--resume", str(run))
    assert f"{run / 'config.json'} is not valid JSON" in err
    data = get_recipe(DEFAULT_RECIPE).to_dict()
    data["algorithm"]["kl_beta"] = float("nan")  # what json.dumps wrote before NaN was refused
    (run / "config.json").write_text(json.dumps(data))
    err = _cli_error(capsys, "train", "--resume", str(run))
    assert "is not valid JSON: NaN is not a number JSON allows" in err


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        (
            "train",
            "iterations",
            "ten",
            'train.iterations: expected an integer, got "ten" (a string)',
        ),
        ("optim", "lr", True, "optim.lr: expected a number, got true (a boolean)"),
        ("optim", "max_grad_norm", "1", 'optim.max_grad_norm: expected a number or null, got "1"'),
        ("optim", "betas", 0.9, "optim.betas: expected a list, got 0.9 (a number)"),
        ("optim", "betas", [0.9, "x"], 'optim.betas.1: expected a number, got "x"'),
        ("sampler", "log_prob_reduction", "avg", "sampler.log_prob_reduction: expected one of"),
        ("policy", "kwargs", [], "policy.kwargs: expected an object, got [] (a list)"),
        ("train", None, 3, "train: expected a section (a JSON object), got 3"),
        ("reward", None, {"name": "x"}, "reward: expected a list of sections"),
        ("algorithm", "kl_beta", "0.1", "algorithm.kl_beta: expected a number"),
    ],
)
def test_resume_with_wrong_types_names_file_and_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    section: str,
    key: str | None,
    value: Any,
    message: str,
) -> None:
    data = get_recipe(DEFAULT_RECIPE).to_dict()
    if key is None:
        data[section] = value
    else:
        data[section][key] = value
    run = _run_with_config(tmp_path, json.dumps(data))
    err = _cli_error(capsys, "train", "--resume", str(run))
    assert f"{run / 'config.json'}: {message}" in err


def test_dict_round_trip_still_accepts_integral_floats() -> None:
    data = get_recipe(DEFAULT_RECIPE).to_dict()
    data["optim"]["lr"] = 1  # JSON has one number type
    assert config_from_dict(data).optim.lr == 1
    with pytest.raises(ConfigError, match=r"train\.group_size: expected an integer, got 2\.5"):
        config_from_dict({**data, "train": {"group_size": 2.5}})


# -- prompts ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "message"),
    [(b"\x89PNG\r\n\x1a\n\x00\x00", "is not UTF-8 text"), (b"a cat\x00\x00\n", "is binary")],
)
def test_binary_prompt_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    prompts = tmp_path / "prompts.png"
    prompts.write_bytes(content)
    err = _cli_error(capsys, "train", "--set", f"prompts.dataset={prompts}")
    assert f"prompt file {prompts} {message}" in err


# -- values that cannot train ------------------------------------------------------------------------
def _float_fields(cls: type, prefix: str) -> list[str]:
    """Dotted paths of every float field (and float list item) of a config dataclass."""
    paths = []
    for name, hint in typing.get_type_hints(cls).items():
        path = f"{prefix}{name}"
        args = typing.get_args(hint)
        if dataclasses.is_dataclass(hint):
            paths += _float_fields(hint, f"{path}.")
        elif typing.get_origin(hint) is list and args and dataclasses.is_dataclass(args[0]):
            paths += _float_fields(args[0], f"{path}.0.")
        elif hint is float or (float in args and type(None) in args):
            paths.append(path)
        elif typing.get_origin(hint) is list and args == (float,):
            paths.append(f"{path}.0")
    return paths


def _every_float_setting() -> list[tuple[str, ...]]:
    settings = [(p,) for p in _float_fields(TrainConfig, "") if not p.startswith("algorithm.")]
    for name in sorted(ALGORITHMS):
        config_cls = type(algorithm_config(name))
        settings += [
            (f"algorithm.name={name}", f"algorithm.{p}") for p in _float_fields(config_cls, "")
        ]
    return settings


def test_every_float_field_is_covered() -> None:
    paths = [s[-1] for s in _every_float_setting()]
    for expected in ("reward.0.weight", "optim.betas.0", "algorithm.kl_beta", "optim.ema_decay"):
        assert expected in paths
    assert len(paths) > 40


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_nan_and_inf_are_rejected_in_every_float_field(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for *prefix, path in _every_float_setting():
        args = [a for setting in (*prefix, f"{path}={value}") for a in ("--set", setting)]
        err = _cli_error(capsys, "train", *args)
        assert f"{path} must be a finite number, got {float(value)}" in err, (path, err)
    err = _cli_error(capsys, "train", "--set", 'reward.0.kwargs={"scale": NaN}')
    assert "reward.0.kwargs.scale must be a finite number, got nan" in err


@pytest.mark.parametrize("name", sorted(n for n, c in ALGORITHMS.items() if c.needs_groups))
def test_group_of_one_is_rejected_for_group_relative_algorithms(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _cli_error(
        capsys, "train", "--set", f"algorithm.name={name}", "--set", "train.group_size=1"
    )
    assert f"train.group_size must be >= 2 for {name}" in err


def test_algorithms_without_groups_accept_a_group_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    config = get_recipe(DEFAULT_RECIPE).apply_overrides(["train.group_size=1"])
    with pytest.raises(ConfigError, match="group_size must be >= 2"):
        config.validate()
    monkeypatch.setattr(ALGORITHMS["flow_grpo"], "needs_groups", False)
    config.validate()


def test_all_zero_reward_weights_are_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    err = _cli_error(capsys, "train", "--set", "reward.0.weight=0")
    assert "reward.0.weight: every reward weight is 0" in err
    err = _cli_error(capsys, "train", "--set", "reward.0.weight=0", "--set",
                     "reward.1.name=target_color", "--set", "reward.1.weight=0")  # fmt: skip
    assert "reward.0.weight, reward.1.weight: every reward weight is 0" in err
    get_recipe(DEFAULT_RECIPE).apply_overrides(
        ["reward.1.name=target_color", "reward.1.weight=0"]
    ).validate()


# -- checkpoints of another run, unknown commands ---------------------------------------------
def test_a_missing_checkpoint_path_is_named_for_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``genrl eval --checkpoint missing`` said "cannot resume"."""
    missing = tmp_path / "missing"
    expected = f"genrl: error: checkpoint path {missing} does not exist\n"
    assert _cli_error(capsys, "eval", "--checkpoint", str(missing)) == expected
    assert _cli_error(capsys, "train", "--resume", str(missing)) == expected


@pytest.mark.parametrize(
    ("command", "hint"),
    [
        ("recipes", "`genrl list --recipes` lists the recipes"),
        ("rewards", "`genrl list` lists the rewards"),
        ("digits_flow_grpo", "to train that recipe: genrl train digits_flow_grpo"),
        (
            "tarin",
            "`genrl --help` describes the commands; `genrl list --recipes` lists the recipes",
        ),
    ],
)
def test_an_unknown_command_gets_argparse_message_and_a_hint(
    command: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([command])
    assert info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == (
        f"genrl: error: argument command: invalid choice: {command!r} (choose from 'train', "
        "'eval', 'sample', 'export', 'plan', 'serve-reward', 'serve-rollout', 'train-reward', 'list'); "
        + hint
    )


def test_a_run_under_another_recipe_is_refused_before_models_are_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A digits run resumed as llm_countdown_grpo failed after the models had loaded, with a
    hint about LoRA; the run's config.json is compared first."""
    run = tmp_path / "run"
    Trainer(tiny_config(tmp_path, f"output_dir={run}", "train.iterations=1")).train()

    def no_models(*args: object) -> None:
        raise AssertionError("models were built before the configs were compared")

    monkeypatch.setattr(genrl.loop.trainer, "build_run", no_models)
    err = _cli_error(capsys, "train", "llm_countdown_grpo", "--resume", str(run))
    assert err == (
        f"genrl: error: {run} is a run of recipe 'digits_flow_grpo', not 'llm_countdown_grpo': "
        "resume it without naming a recipe (its config.json is used), or start "
        "llm_countdown_grpo in a directory of its own\n"
    )
    # The same recipe with a key its checkpoints depend on changed: the key is named.
    err = _cli_error(capsys, "train", "--resume", str(run), "--set", "policy.lora_rank=4")
    assert err == (
        f"genrl: error: the checkpoints of {run} do not fit this config (policy.lora_rank 0 "
        "there, 4 here): use the run's own config.json (the CLI does when no recipe is named) "
        "or set these keys as the run had them\n"
    )
    # Scoring with another recipe is allowed as long as the policy is the checkpoint's.
    flow = tiny_overrides(tmp_path)[0].partition("=")[2]
    err = _cli_error(capsys, "eval", "llm_countdown_grpo", "--checkpoint", str(run))
    assert err == (
        f"genrl: error: the checkpoints of {run} do not fit this config (policy.name "
        f'"toy_digits" there, "countdown_lm" here; policy.pretrained "{flow}" there, null '
        "here): use the run's own config.json (the CLI does when no recipe is named) or set "
        "these keys as the run had them\n"
    )
