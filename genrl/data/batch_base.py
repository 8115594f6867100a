"""The base of every rollout container: ``Batch`` (per-sample fields, ``select``,
``concatenate``) and the padding helpers the token and flow batches share."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import torch

B = TypeVar("B", bound="Batch")


@dataclass
class Batch:
    """Base class: fields that are tensors, lists or dicts of tensors are per-sample."""

    def __len__(self) -> int:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                return value.shape[0]
            if isinstance(value, list):
                return len(value)
        raise TypeError(f"{type(self).__name__} has no per-sample field")

    def select(self: B, index: torch.Tensor | slice) -> B:
        """A new batch holding the samples at ``index`` (a slice or a ``[M]`` long tensor)."""
        values = {f.name: _select(getattr(self, f.name), index) for f in dataclasses.fields(self)}
        return type(self)(**values)

    def without_excluded(self: B) -> B:
        """The batch without the samples its ``excluded`` field marks (itself when it has no
        such field, or none is marked)."""
        excluded = getattr(self, "excluded", None)
        if excluded is None or not bool(excluded.any()):
            return self
        return self.select((~excluded).nonzero()[:, 0])

    @classmethod
    def concatenate(cls: type[B], batches: list[B]) -> B:
        """One batch with the samples of ``batches`` in order (e.g. the rounds of dynamic
        sampling). Per-sample tensors must agree beyond the batch dimension; subclasses whose
        widths vary from batch to batch (padded token sequences) align them first."""
        if not batches:
            raise ValueError("nothing to concatenate")
        return cls(
            **{
                f.name: _concatenate([getattr(b, f.name) for b in batches], f.name)
                for f in dataclasses.fields(cls)
            }
        )


def _select(value: object, index: torch.Tensor | slice) -> object:
    if isinstance(value, torch.Tensor):
        return value[index]
    if isinstance(value, list):
        if isinstance(index, slice):
            return value[index]
        return [value[i] for i in index.tolist()]
    if isinstance(value, dict):
        return {k: _select(v, index) for k, v in value.items()}
    return value


def _concatenate(values: list, name: str) -> object:
    first = values[0]
    if isinstance(first, torch.Tensor):
        shapes = {tuple(v.shape[1:]) for v in values}
        if len(shapes) > 1:
            raise ValueError(f"cannot concatenate field {name!r}: per-sample shapes {shapes}")
        return torch.cat(values)
    if isinstance(first, list):
        return [item for value in values for item in value]
    if isinstance(first, dict):
        return {k: _concatenate([v[k] for v in values], f"{name}.{k}") for k in first}
    if any(v is not first for v in values[1:]):
        raise ValueError(f"cannot concatenate field {name!r}: batches hold different objects")
    return first


def _pad_to(
    inputs: dict[str, torch.Tensor], sizes: dict[str, list[int]]
) -> dict[str, torch.Tensor]:
    """Each ``[N, ...]`` tensor zero-padded at the end of every non-batch dimension to
    ``sizes[name]``."""
    padded = {}
    for name, tensor in inputs.items():
        for dim, size in enumerate(sizes[name], start=1):
            tensor = _pad_columns(tensor, dim, 0, size - tensor.shape[dim])
        padded[name] = tensor
    return padded


def _sequence_widths(conditions: list[dict[str, torch.Tensor]]) -> dict[str, list[int]]:
    """``{key: [widest dim 1, *rest]}`` for condition tensors that differ only in dim 1."""
    widths = {}
    for key, first in conditions[0].items():
        shapes = {tuple(c[key].shape[1:]) for c in conditions}
        if first.ndim >= 2 and len(shapes) > 1 and len({s[1:] for s in shapes}) == 1:
            widths[key] = [max(s[0] for s in shapes), *first.shape[2:]]
    return widths


def _only(
    condition: dict[str, torch.Tensor], keys: dict[str, list[int]]
) -> dict[str, torch.Tensor]:
    return {k: v for k, v in condition.items() if k in keys}


def _pad_columns(
    tensor: torch.Tensor, dim: int, before: int, after: int, value: float = 0
) -> torch.Tensor:
    """``tensor`` widened along ``dim`` by ``before`` leading and ``after`` trailing columns."""
    if before == 0 and after == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] += before + after
    out = tensor.new_full(shape, value)
    out.narrow(dim, before, tensor.shape[dim]).copy_(tensor)
    return out
