"""The offline rollout store: round trip, epochs, and recovery after a kill mid-write."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from genrl.data.rollout_store import GroupRecord, RolloutStore


def group(prompt: str, seed: int, size: int = 3) -> GroupRecord:
    generator = torch.Generator().manual_seed(seed)
    return GroupRecord(
        prompt=prompt,
        samples=torch.randn(size, 1, 4, 4, generator=generator),
        rewards={
            "a": torch.rand(size, generator=generator),
            "b": torch.rand(size, generator=generator),
        },
        seeds=list(range(seed, seed + size)),
        sampler={"name": "flow_ode", "num_steps": 10},
    )


def test_rewards_that_share_one_tensor_are_stored(tmp_path: Path) -> None:
    """One score logged under two names (a view of one tensor) is stored as two copies."""
    shared = torch.tensor([0.5, 1.0])
    store = RolloutStore(tmp_path)
    store.append([GroupRecord("x", torch.zeros(2, 3), {"a": shared, "b": shared[:]})])
    back = RolloutStore(tmp_path).group(0)
    assert back.rewards["a"].tolist() == back.rewards["b"].tolist() == [0.5, 1.0]


def test_round_trip_append_and_reopen(tmp_path: Path) -> None:
    store = RolloutStore(tmp_path)
    written = [group("a cat", 1), group("a dog", 2)]
    assert store.append(written) == [0, 1]
    assert store.append([group("a bird", 3, size=5)]) == [2]
    reopened = RolloutStore(tmp_path)
    assert len(reopened) == 3
    back = reopened.group(1)
    assert back.prompt == "a dog" and back.seeds == [2, 3, 4] and back.group_id == 1
    assert torch.equal(back.samples, written[1].samples)
    assert torch.equal(back.rewards["b"], written[1].rewards["b"])
    assert back.sampler == {"name": "flow_ode", "num_steps": 10}
    assert reopened.group(2).samples.shape == (5, 1, 4, 4)
    seen = [g.group_id for g in reopened.epochs(2, seed=0)]
    assert sorted(seen[:3]) == sorted(seen[3:]) == [0, 1, 2]  # each epoch: every group once
    with pytest.raises(IndexError):
        reopened.group(3)
    with pytest.raises(ValueError, match="expected \\[3\\]"):
        store.append([GroupRecord("x", torch.zeros(3, 2), {"a": torch.zeros(2)})])


CRASH = textwrap.dedent(
    """
    import os, sys, torch
    sys.path.insert(0, {tests!r})
    from test_rollout_store import group
    from genrl.data import rollout_store
    from genrl.data.rollout_store import RolloutStore

    store = RolloutStore({directory!r})
    store.append([group("first", 1), group("second", 2)])
    point = {point!r}
    real_replace, real_open = os.replace, open
    if point == "before_rename":
        os.replace = lambda *a: os._exit(1)          # the shard is still a temporary file
    elif point == "after_rename":
        def replace(*a):
            real_replace(*a)
            os._exit(1)                              # the shard is in place, the index line not
        os.replace = replace
    elif point == "torn_index":
        class Torn:
            def __init__(self, handle): self.handle = handle
            def __enter__(self): return self
            def __exit__(self, *a): return False
            def write(self, text):
                self.handle.write(text[: len(text) // 2]); self.handle.flush(); os._exit(1)
        def torn_open(path, mode="r", *a, **k):
            handle = real_open(path, mode, *a, **k)
            return Torn(handle) if str(path).endswith("index.jsonl") and "a" in mode else handle
        rollout_store.open = torn_open
    store.append([group("third", 3), group("fourth", 4)])
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["before_rename", "after_rename", "torn_index"])
def test_a_kill_mid_write_loses_only_the_unfinished_append(tmp_path: Path, point: str) -> None:
    tests = str(Path(__file__).parent)
    script = CRASH.format(tests=tests, directory=str(tmp_path / "store"), point=point)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert result.returncode == 1, result.stderr.decode()
    # A reader (another process of the run) sees the complete appends and repairs nothing.
    on_disk = sorted(p.name for p in (tmp_path / "store").iterdir())
    reader = RolloutStore(tmp_path / "store", writable=False)
    assert [reader.group(i).prompt for i in range(len(reader))] == ["first", "second"]
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == on_disk
    with pytest.raises(PermissionError, match="read-only"):
        reader.append([group("fifth", 5)])
    store = RolloutStore(tmp_path / "store")
    assert len(store) == 2 and [store.group(i).prompt for i in range(2)] == ["first", "second"]
    files = sorted(p.name for p in (tmp_path / "store").iterdir())
    assert files == ["index.jsonl", "shard-000000.safetensors"]  # nothing half-written is left
    # The writer resumes: ids continue, nothing is duplicated.
    assert store.append([group("third", 3), group("fourth", 4)]) == [2, 3]
    again = RolloutStore(tmp_path / "store")
    assert [again.group(i).prompt for i in range(4)] == ["first", "second", "third", "fourth"]
