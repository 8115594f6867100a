"""Checkpoints are verified before they are loaded: a damaged file is named, a run directory
falls back to its newest intact checkpoint, and saving is durable (fsync) and reports a full
disk by file."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import tiny_config

import genrl.checkpoints.checkpoint as ckpt
from genrl import Trainer
from genrl.checkpoints.checkpoint import CorruptCheckpointError, load_checkpoint, resolve_checkpoint
from genrl.cli.main import main
from genrl.data.fileio import DiskFullError

FILES = [
    "trainable.safetensors",
    "ema.safetensors",
    "optimizer.pt",
    "state.pt",
    "state.json",
    "manifest.json",
]


def _save(run_dir: Path, iteration: int, **extra: Any) -> Path:
    generator = torch.Generator().manual_seed(iteration)
    weights = {"layer.weight": torch.randn(64, 32, generator=generator)}
    return ckpt.save_checkpoint(
        run_dir,
        iteration,
        trainable=weights,
        optimizer={
            "state": {0: {"exp_avg": torch.randn(64, 32, generator=generator)}},
            "param_groups": [{"lr": 1e-3, "params": [0]}],
        },
        state={"optimizer_steps": iteration, "rollout": {}, "objective": {}, "reward": {}, **extra},
        ema={k: v.clone() for k, v in weights.items()},
        keep=5,
    )


def _damage(file: Path, how: str) -> None:
    data = bytearray(file.read_bytes())
    if how == "flip":  # 1,000 bytes (or half a small file) in the middle, size unchanged
        n = min(1000, len(data) // 2)
        start = (len(data) - n) // 2
        for i in range(start, start + n):
            data[i] ^= 0xFF
    elif how == "truncate":
        data = data[: len(data) // 2]
    elif how == "delete":
        file.unlink()
        return
    else:
        data = bytearray()
    file.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip", "truncate", "empty", "delete"])
@pytest.mark.parametrize("name", FILES)
def test_damaged_file_is_named_and_a_run_falls_back(
    tmp_path: Path, name: str, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    older = _save(run, 1)
    newest = _save(run, 2)
    _damage(newest / name, how)

    with pytest.raises(CorruptCheckpointError) as info:
        resolve_checkpoint(newest)
    message = str(info.value)
    assert str(newest) in message and name in message and "\n" not in message

    capsys.readouterr()
    assert resolve_checkpoint(run) == older
    warning = capsys.readouterr().err
    assert f"{newest}" in warning and name in warning and "skipping it" in warning
    assert f"using {older}" in warning
    assert load_checkpoint(older)["state"]["iteration"] == 1


def test_no_intact_checkpoint_is_an_error(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _damage(_save(run, 1) / "optimizer.pt", "flip")
    _damage(_save(run, 2) / "state.pt", "truncate")
    with pytest.raises(
        CorruptCheckpointError, match=r"no intact checkpoint in .*state\.pt.*optimizer\.pt"
    ):
        resolve_checkpoint(run)


def test_manifest_records_every_file(tmp_path: Path) -> None:
    import hashlib

    path = _save(tmp_path / "run", 3)
    manifest = json.loads((path / "manifest.json").read_text())
    assert sorted(manifest["files"]) == sorted(set(FILES) - {"manifest.json"})
    for name, entry in manifest["files"].items():
        data = (path / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    loaded = load_checkpoint(path)
    assert loaded["state"]["iteration"] == 3 and "ema" in loaded


def test_save_fsyncs_files_and_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    synced_dirs: list[Path] = []
    synced_fds: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(ckpt, "fsync_directory", lambda d: synced_dirs.append(Path(d)))
    monkeypatch.setattr(ckpt.os, "fsync", lambda fd: (synced_fds.append(fd), real_fsync(fd)))
    run = tmp_path / "run"
    path = _save(run, 1)
    assert len(synced_fds) == len(FILES)  # every file, the manifest included
    # The filled temporary directory, then the rename in checkpoints/ and checkpoints/ in run/.
    assert synced_dirs == [path.with_name(".tmp-iter_000001"), run / "checkpoints", run]


def test_a_checkpoint_without_its_manifest_is_corrupt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting manifest.json used to turn the check off with a warning, so a flipped byte then
    loaded; every checkpoint genrl writes has a manifest, so one without is refused."""
    run = tmp_path / "run"
    older = _save(run, 1)
    newest = _save(run, 2)
    (newest / "manifest.json").unlink()
    _damage(newest / "trainable.safetensors", "flip")  # same size: only a checksum sees it
    expected = (
        f"checkpoint {newest} is corrupt: manifest.json is missing, so its files cannot be "
        "checked (genrl writes one into every checkpoint)"
    )
    with pytest.raises(CorruptCheckpointError) as info:
        resolve_checkpoint(newest)
    assert str(info.value) == expected
    with pytest.raises(CorruptCheckpointError) as info:
        load_checkpoint(newest)
    assert str(info.value) == expected
    capsys.readouterr()
    assert resolve_checkpoint(run) == older  # resuming the run falls back, as for other damage
    assert f"genrl: warning: {expected}; skipping it" in capsys.readouterr().err


class Smuggled:
    """Not a tensor or a plain value: ``weights_only`` loading refuses it."""


def _tamper(path: Path, name: str) -> None:
    """Replace ``name`` with a pickle of a foreign object and update the manifest to match, as
    someone who knows the format would."""
    torch.save({"payload": Smuggled()}, path / name)
    _record(path, name)


def _record(path: Path, name: str) -> None:
    """Write ``name``'s present size and checksum into the manifest, so that a file replaced
    on purpose passes verification and reaches the loader's own checks."""
    import hashlib

    manifest = json.loads((path / "manifest.json").read_text())
    data = (path / name).read_bytes()
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["optimizer.pt", "state.pt"])
def test_refused_pickle_says_not_a_checkpoint_or_tampered(tmp_path: Path, name: str) -> None:
    path = _save(tmp_path / "run", 1)
    _tamper(path, name)
    with pytest.raises(
        CorruptCheckpointError, match=f"{name} is not a genrl checkpoint file or was tampered with"
    ):
        load_checkpoint(path)


def test_state_that_is_not_ours_is_named(tmp_path: Path) -> None:
    path = _save(tmp_path / "run", 1)
    torch.save({"weights": torch.zeros(2)}, path / "state.pt")
    _record(path, "state.pt")
    with pytest.raises(CorruptCheckpointError, match=r"state\.pt is not a genrl checkpoint state"):
        load_checkpoint(path)


def test_a_checkpoint_of_the_one_algorithm_state_layout_says_so(tmp_path: Path) -> None:
    path = _save(tmp_path / "run", 1)
    old = {"iteration": 1, "optimizer_steps": 1, "algorithm": {}, "reward": {}}
    torch.save(old, path / "state.pt")
    _record(path, "state.pt")
    with pytest.raises(CorruptCheckpointError, match="before rollouts and objectives were split"):
        load_checkpoint(path)


class _FullDiskFile:
    """A file whose writes fail as on a full disk."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __enter__(self) -> _FullDiskFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def _fill_disk_at(monkeypatch: pytest.MonkeyPatch, victim: str) -> None:
    def full_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = open(file, mode, *args, **kwargs)  # noqa: SIM115 (closed by the wrapper)
        return _FullDiskFile(handle) if Path(file).name == victim else handle

    monkeypatch.setattr(ckpt, "open", full_open, raising=False)


@pytest.mark.parametrize("victim", ["trainable.safetensors", "optimizer.pt", "manifest.json"])
def test_full_disk_names_the_file_and_leaves_no_partial_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: str
) -> None:
    run = tmp_path / "run"
    older = _save(run, 1)
    _fill_disk_at(monkeypatch, victim)
    with pytest.raises(DiskFullError) as info:
        _save(run, 2)
    assert str(info.value).startswith("the disk is full: cannot write ")
    assert str(info.value).endswith(f".tmp-iter_000002/{victim} (No space left on device)")
    assert ckpt.list_checkpoints(run) == [older]
    assert not (run / "checkpoints" / ".tmp-iter_000002").exists()


# -- through the trainer and the command line ----------------------------------------------------
def _trained_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    config = tiny_config(tmp_path, f"output_dir={run}", "logging.checkpoint_every=1")
    Trainer(config).train()
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["iter_000001", "iter_000002"]
    return run


@pytest.mark.parametrize(
    ("without_manifest", "named"),
    [(False, "trainable.safetensors differs"), (True, "manifest.json is missing")],
)
def test_resume_falls_back_to_the_newest_intact_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], without_manifest: bool, named: str
) -> None:
    run = _trained_run(tmp_path)
    bad = run / "checkpoints" / "iter_000002"
    _damage(bad / "trainable.safetensors", "flip")
    if without_manifest:
        (bad / "manifest.json").unlink()
    capsys.readouterr()
    config = tiny_config(tmp_path, "train.iterations=3")
    trainer = Trainer(config, run_dir=run, resume_from=run)
    assert f"{bad} is corrupt: {named}" in capsys.readouterr().err
    trainer.train()
    assert (run / "checkpoints" / "abandoned" / "iter_000002").is_dir()  # set aside, not reused
    assert json.loads((run / "summary.json").read_text())["iterations"] == 3


def test_cli_on_a_corrupt_checkpoint_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _trained_run(tmp_path)
    bad = run / "checkpoints" / "iter_000002"
    _damage(bad / "optimizer.pt", "truncate")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"genrl: error: checkpoint {bad} is corrupt")
    assert "optimizer.pt" in err

    _tamper(run / "checkpoints" / "iter_000001", "state.pt")
    assert main(["sample", "--checkpoint", str(run / "checkpoints" / "iter_000001")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "state.pt is not a genrl checkpoint file" in err
