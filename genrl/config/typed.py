"""Values checked against their field's type, and the check that every number is finite.

A hand-edited or damaged ``config.json`` fails with one message naming the field, instead of a
comparison error deep in ``validate()``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from typing import Any, Literal, Union

from genrl.config.errors import ConfigError


def check_finite(value: Any, path: str = "") -> None:
    """Raise ``ConfigError`` naming the first NaN or infinite float anywhere in ``value`` (config
    dataclasses, their lists and free-form dicts such as reward kwargs): NaN passes every range
    check (all its comparisons are false) and would end up in ``config.json``, which JSON
    cannot hold."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            check_finite(getattr(value, field.name), join_path(path, field.name))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_finite(item, join_path(path, str(i)))
    elif isinstance(value, dict):
        for key, item in value.items():
            check_finite(item, join_path(path, str(key)))
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path} must be a finite number, got {value}")


def join_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


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
        raise ConfigError(f"{where}: expected {expected}, {value_kind(value)}")
    if origin is Literal:
        choices = list(typing.get_args(hint))
        if value not in choices or not isinstance(value, str):
            raise ConfigError(f"{where}: expected one of {choices}, got {json.dumps(value)}")
        return
    if origin is list or hint is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, {value_kind(value)}")
        (item,) = typing.get_args(hint) or (Any,)
        for i, element in enumerate(value):
            check_type(element, item, f"{where}.{i}")
        return
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected an object, {value_kind(value)}")
        return
    fits = {
        bool: isinstance(value, bool),
        # JSON has one number type: an integral float field may hold 1 as well as 1.0.
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(hint, True)
    if not fits:
        raise ConfigError(f"{where}: expected {_EXPECTED[hint]}, {value_kind(value)}")


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


def value_kind(value: Any) -> str:
    """``got "10" (a string)``: what a JSON value is, for messages."""
    kind = {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(
        type(value), "a number" if isinstance(value, int | float) else "null"
    )
    text = json.dumps(value)
    return f"got {text if len(text) <= 40 else text[:37] + '...'} ({kind})"
