"""Configs as JSON (a run's ``config.json``): rebuilding a ``TrainConfig`` with every value
checked against its field's type (``genrl/config/typed.py``).

A hand-edited or damaged ``config.json`` fails with one message naming the file and the field,
instead of a comparison error deep in ``validate()``.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, cast

from genrl.config.errors import ConfigError, unknown_message
from genrl.config.typed import check_type, join_path, value_kind

if typing.TYPE_CHECKING:
    from genrl.run.config import TrainConfig


def config_from_dict(data: dict) -> TrainConfig:
    """Rebuild a ``TrainConfig`` from ``to_dict()`` output (e.g. a run's ``config.json``); a
    value of the wrong type raises ``ConfigError`` naming its field."""
    from genrl.algorithms import ALGORITHMS
    from genrl.run.config import ROLLOUT_SECTIONS, TrainConfig, algorithm_config

    data = dict(data)
    algorithm = data.pop("algorithm", None)
    if not isinstance(algorithm, dict) or not isinstance(algorithm.get("name"), str):
        raise ConfigError("algorithm: the config needs an algorithm section with a 'name'")
    sections = {name: data.pop(name, None) for name in ROLLOUT_SECTIONS}
    config = _build(TrainConfig, data, "")
    config.algorithm = _build(type(algorithm_config(algorithm["name"])), algorithm, "algorithm")
    # The rollout sections are built as the classes the algorithm reads (Algorithm.sections).
    needed = ALGORITHMS[algorithm["name"]].sections
    for name, value in sections.items():
        cls = needed.get(name)
        if cls is None and value is not None:
            raise ConfigError(
                f"{name}: {algorithm['name']} has no {name} section; delete it or set it to null"
            )
        if cls is not None:
            setattr(config, name, cls() if value is None else _build(cls, value, name))
    return config


def config_from_file(path: str | Path) -> TrainConfig:
    """The config in the JSON file ``path``; every error names the file (and the field)."""
    path = Path(path)

    def refuse_constant(name: str) -> Any:
        raise ConfigError(f"{path} is not valid JSON: {name} is not a number JSON allows")

    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse_constant)
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file (not UTF-8)") from None
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{path} is not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object of config sections, {value_kind(data)}")
    try:
        return config_from_dict(data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a section (a JSON object), {value_kind(data)}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        where = join_path(path, key)
        if key not in names:
            raise ConfigError(unknown_message(key, sorted(names), where))
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            value = _build(cast(type, hint), value, where)
        elif typing.get_origin(hint) is list and dataclasses.is_dataclass(typing.get_args(hint)[0]):
            if not isinstance(value, list):
                raise ConfigError(f"{where}: expected a list of sections, {value_kind(value)}")
            item = typing.get_args(hint)[0]
            value = [_build(item, v, f"{where}.{i}") for i, v in enumerate(value)]
        else:
            check_type(value, hint, where)
        kwargs[key] = value
    return cls(**kwargs)
