"""An offline store of sampled groups (for offline objectives such as GDRO, and for replay).

A store is a directory:

    index.jsonl              one line per append: its shard and its groups (id, prompt, seeds,
                             reward names, sampler)
    shard-000000.safetensors the tensors of the groups of one append: ``{id}/samples`` ``[G, ...]``
                             and ``{id}/reward/{name}`` ``[G]``

An append writes its shard to a temporary file, fsyncs it, renames it into place (atomic), and only
then appends the index line that lists its groups (one write, fsynced). An append is all or
nothing: a process killed at any point leaves either the whole append (shard renamed and index
line written) or nothing that counts. On open, temporary files are removed, a torn last index line
is cut off, and shards that no index line names are deleted. So a writer that resumes after an
interruption continues from the last complete append, with nothing lost or written twice, and
group ids stay consecutive.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from genrl.data.fileio import fsync_directory, fsync_file
from genrl.data.rng import Streams, stream_generator

INDEX = "index.jsonl"


@dataclass
class GroupRecord:
    """One prompt's group of samples.

    Attributes:
        prompt: the prompt.
        samples: ``[G, ...]`` latents or images.
        rewards: reward name -> ``[G]`` float32 scores.
        seeds: per-sample seeds (or any ints that reproduce the samples).
        sampler: the sampler settings the samples were drawn with.
        group_id: assigned by the store.
    """

    prompt: str
    samples: torch.Tensor
    rewards: dict[str, torch.Tensor]
    seeds: list[int] = field(default_factory=list)
    sampler: dict[str, Any] = field(default_factory=dict)
    group_id: int = -1


class RolloutStore:
    """Append-only store of groups; see the module docstring for the on-disk contract.

    Args:
        directory: the store (created if missing).
        writable: False opens it for reading only: nothing on disk is repaired or removed, which
            is how processes other than the writer open a store (several processes of a run).
    """

    def __init__(self, directory: str | Path, writable: bool = True) -> None:
        self.directory = Path(directory)
        self.writable = writable
        if writable:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._entries: list[dict[str, Any]] = []
        self._recover()

    # -- opening ---------------------------------------------------------------------------------
    def _recover(self) -> None:
        if self.writable:
            for partial in self.directory.glob("*.tmp"):
                partial.unlink()
        index = self.directory / INDEX
        if index.is_file():
            data = index.read_bytes()
            complete = data[: data.rfind(b"\n") + 1]  # a torn last line never counts
            if self.writable and len(complete) != len(data):
                with open(index, "wb") as handle:
                    handle.write(complete)
                    handle.flush()
                    os.fsync(handle.fileno())
            for line in complete.decode().splitlines():
                if line:
                    record = json.loads(line)
                    self._entries += [dict(g, shard=record["shard"]) for g in record["groups"]]
        if not self.writable:
            return
        named = {entry["shard"] for entry in self._entries}
        for shard in self.directory.glob("shard-*.safetensors"):
            if shard.name not in named:  # renamed into place, but its index lines never came
                shard.unlink()

    # -- writing ---------------------------------------------------------------------------------
    def append(self, groups: list[GroupRecord]) -> list[int]:
        """Store ``groups`` as one shard; returns their ids."""
        if not self.writable:
            raise PermissionError(f"the store {self.directory} was opened read-only")
        if not groups:
            return []
        from safetensors.torch import save_file

        first = len(self._entries)
        shard = f"shard-{self._next_shard():06d}.safetensors"
        tensors, records = {}, []
        for offset, group in enumerate(groups):
            group_id = first + offset
            size = group.samples.shape[0]
            for name, values in group.rewards.items():
                if tuple(values.shape) != (size,):
                    raise ValueError(
                        f"group {group_id}: reward {name!r} has shape {tuple(values.shape)}, "
                        f"expected [{size}]"
                    )
                # Copies: a reward may log one tensor under two names (the compositional
                # reward's score is its ``requirements`` with partial credit), and safetensors
                # refuses tensors that share memory.
                tensors[f"{group_id}/reward/{name}"] = values.detach().float().cpu().clone()
            tensors[f"{group_id}/samples"] = group.samples.detach().cpu().clone()
            records.append({
                "id": group_id,
                "prompt": group.prompt,
                "size": size,
                "seeds": [int(s) for s in group.seeds],
                "rewards": sorted(group.rewards),
                "sampler": group.sampler,
            })  # fmt: skip
        temporary = self.directory / (shard + ".tmp")
        save_file(tensors, str(temporary))
        fsync_file(temporary)
        os.replace(temporary, self.directory / shard)
        fsync_directory(self.directory)  # the rename itself survives a power loss
        line = json.dumps({"shard": shard, "groups": records}, sort_keys=True)
        with open(self.directory / INDEX, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self._entries.extend(dict(r, shard=shard) for r in records)
        return list(range(first, first + len(groups)))

    def _next_shard(self) -> int:
        numbers = [int(e["shard"][6:12]) for e in self._entries]
        return max(numbers, default=-1) + 1

    # -- reading ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def _entry(self, group_id: int) -> dict[str, Any]:
        if not 0 <= group_id < len(self._entries):
            raise IndexError(f"group {group_id} not in the store ({len(self._entries)} groups)")
        return self._entries[group_id]

    def prompt(self, group_id: int) -> str:
        return self._entry(group_id)["prompt"]

    def group_size(self, group_id: int) -> int:
        return int(self._entry(group_id)["size"])

    def sampler_record(self, group_id: int) -> dict[str, Any]:
        """The settings the group was sampled with (``GroupRecord.sampler``)."""
        return dict(self._entry(group_id)["sampler"])

    def rewards(self, group_id: int) -> dict[str, torch.Tensor]:
        """The group's scores, name -> ``[G]``, without reading its samples."""
        from safetensors import safe_open

        entry = self._entry(group_id)
        with safe_open(str(self.directory / entry["shard"]), framework="pt") as handle:
            return {
                name: handle.get_tensor(f"{group_id}/reward/{name}") for name in entry["rewards"]
            }

    def group(self, group_id: int) -> GroupRecord:
        from safetensors import safe_open

        entry = self._entry(group_id)
        with safe_open(str(self.directory / entry["shard"]), framework="pt") as handle:
            samples = handle.get_tensor(f"{group_id}/samples")
            rewards = {
                name: handle.get_tensor(f"{group_id}/reward/{name}") for name in entry["rewards"]
            }
        return GroupRecord(
            prompt=entry["prompt"],
            samples=samples,
            rewards=rewards,
            seeds=list(entry["seeds"]),
            sampler=dict(entry["sampler"]),
            group_id=group_id,
        )

    def epochs(self, num_epochs: int, seed: int = 0) -> Iterator[GroupRecord]:
        """Every group once per epoch, in an order shuffled per epoch from ``seed``."""
        for epoch in range(num_epochs):
            generator = stream_generator("store", Streams.OFFLINE_ORDER, seed, epoch)
            order = torch.randperm(len(self), generator=generator)
            for group_id in order.tolist():
                yield self.group(group_id)


__all__ = ["GroupRecord", "RolloutStore"]
