"""Configs as JSON (a run's ``config.json``): rebuilding a ``TrainConfig`` with every value
checked against its field's type, and the check that every number in a config is finite.

A hand-edited or damaged ``config.json`` fails with one message naming the file and the field,
instead of a comparison error deep in ``validate()``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, cast

from genrl.overrides import ConfigError, unknown_message

if typing.TYPE_CHECKING:
    from genrl.config import TrainConfig


def check_finite(value: Any, path: str = "") -> None:
    """Raise ``ConfigError`` naming the first NaN or infinite float anywhere in ``value`` (config
    dataclasses, their lists and free-form dicts such as reward kwargs): NaN passes every range
    check (all its comparisons are false) and would end up in ``config.json``, which JSON
    cannot hold."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            check_finite(getattr(value, field.name), _join(path, field.name))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_finite(item, _join(path, str(i)))
    elif isinstance(value, dict):
        for key, item in value.items():
            check_finite(item, _join(path, str(key)))
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path} must be a finite number, got {value}")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def config_from_dict(data: dict) -> TrainConfig:
    """Rebuild a ``TrainConfig`` from ``to_dict()`` output (e.g. a run's ``config.json``); a
    value of the wrong type raises ``ConfigError`` naming its field."""
    from genrl.algorithms import ALGORITHMS
    from genrl.config import ROLLOUT_SECTIONS, TrainConfig, algorithm_config

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
        raise ConfigError(f"{path}: expected a JSON object of config sections, {_kind(data)}")
    try:
        return config_from_dict(data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a section (a JSON object), {_kind(data)}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        where = _join(path, key)
        if key not in names:
            raise ConfigError(unknown_message(key, sorted(names), where))
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            value = _build(cast(type, hint), value, where)
        elif typing.get_origin(hint) is list and dataclasses.is_dataclass(typing.get_args(hint)[0]):
            if not isinstance(value, list):
                raise ConfigError(f"{where}: expected a list of sections, {_kind(value)}")
            item = typing.get_args(hint)[0]
            value = [_build(item, v, f"{where}.{i}") for i, v in enumerate(value)]
        else:
            check_type(value, hint, where)
        kwargs[key] = value
    return cls(**kwargs)


_EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def check_type(value: Any, hint: Any, where: str) -> None:
    """Raise ``ConfigError`` unless the JSON value ``value`` fits the annotation ``hint``."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return
        for option in options:
            if option is not type(None):
                try:
                    check_type(value, option, where)
                    return
                except ConfigError:
                    continue
        expected = " or ".join(_describe(option) for option in options)
        raise ConfigError(f"{where}: expected {expected}, {_kind(value)}")
    if origin is Literal:
        choices = list(typing.get_args(hint))
        if value not in choices or not isinstance(value, str):
            raise ConfigError(f"{where}: expected one of {choices}, got {json.dumps(value)}")
        return
    if origin is list or hint is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, {_kind(value)}")
        (item,) = typing.get_args(hint) or (Any,)
        for i, element in enumerate(value):
            check_type(element, item, f"{where}.{i}")
        return
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected an object, {_kind(value)}")
        return
    fits = {
        bool: isinstance(value, bool),
        # JSON has one number type: an integral float field may hold 1 as well as 1.0.
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(hint, True)
    if not fits:
        raise ConfigError(f"{where}: expected {_EXPECTED[hint]}, {_kind(value)}")


def _describe(hint: Any) -> str:
    if hint is type(None):
        return "null"
    if typing.get_origin(hint) is Literal:
        return f"one of {list(typing.get_args(hint))}"
    if typing.get_origin(hint) is list or hint is list:
        return "a list"
    if typing.get_origin(hint) is dict or hint is dict:
        return "an object"
    return _EXPECTED.get(hint, str(hint))


def _kind(value: Any) -> str:
    """``got "10" (a string)``: what a JSON value is, for messages."""
    kind = {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(
        type(value), "a number" if isinstance(value, int | float) else "null"
    )
    text = json.dumps(value)
    return f"got {text if len(text) <= 40 else text[:37] + '...'} ({kind})"
