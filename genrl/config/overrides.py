"""Dotted overrides for nested config dataclasses: ``--set algorithm.clip_range=1e-4``.

Values are parsed by the type annotation of the field they set; unknown keys are rejected with the
closest valid name as a suggestion.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from genrl.config.errors import ConfigError, unknown_message


def parse_assignment(text: str) -> tuple[str, str]:
    """Split ``"a.b=value"`` into ``("a.b", "value")``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like key=value, e.g. train.iterations=20")
    return key.strip(), value.strip()


def apply_override(config: Any, dotted_key: str, raw_value: str) -> None:
    """Set ``dotted_key`` (e.g. ``"optim.lr"`` or ``"reward.0.weight"``) on ``config`` in place."""
    parts = dotted_key.split(".")
    target = config
    for depth, part in enumerate(parts[:-1]):
        target = _child(target, part, ".".join(parts[: depth + 1]))
    _assign(target, parts[-1], raw_value, dotted_key)


def _child(obj: Any, part: str, path: str) -> Any:
    if isinstance(obj, list):
        if part == str(len(obj)) and obj and dataclasses.is_dataclass(obj[0]):
            # One past the end of a list of sections adds an entry with default fields, so that
            # ``--set reward.1.name=artifact_probe`` adds a second reward.
            first: Any = obj[0]
            obj.append(type(first)())
        return obj[_list_index(obj, part, path)]
    if isinstance(obj, dict):
        if part not in obj:
            raise ConfigError(unknown_message(part, list(obj), path))
        return obj[part]
    names = [f.name for f in dataclasses.fields(obj)]
    if part not in names:
        raise ConfigError(unknown_message(part, names, path))
    return getattr(obj, part)


def _list_index(obj: list, part: str, path: str) -> int:
    if not part.isdigit() or int(part) >= len(obj):
        raise ConfigError(f"{path}: expected an index below {len(obj)}, got {part!r}")
    return int(part)


def _assign(obj: Any, name: str, raw: str, path: str) -> None:
    if isinstance(obj, list):
        i = _list_index(obj, name, path)
        obj[i] = parse_value(raw, type(obj[i]), path) if obj[i] is not None else _auto(raw)
        return
    if isinstance(obj, dict):
        # Free-form keyword arguments (e.g. a reward's options): parse JSON-ish values.
        obj[name] = _auto(raw)
        return
    fields = {f.name: f for f in dataclasses.fields(obj)}
    if name not in fields:
        raise ConfigError(unknown_message(name, list(fields), path))
    hints = typing.get_type_hints(type(obj))
    if dataclasses.is_dataclass(getattr(obj, name)):
        raise ConfigError(f"{path} is a section; set one of its fields, e.g. {path}.<field>=...")
    setattr(obj, name, parse_value(raw, hints[name], path))


def _auto(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


# JSON's spellings only, as config.json and the API (which writes Python's True as ``true``)
# take them: ``yes``, ``on`` or ``1`` for a boolean is refused rather than guessed.
BOOLEANS = {"true": True, "false": False}


def parse_value(raw: str, annotation: Any, path: str) -> Any:
    """Convert the string ``raw`` to a value of type ``annotation`` or raise ``ConfigError``."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        options = get_args(annotation)
        if type(None) in options and raw.lower() in {"none", "null"}:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return parse_value(raw, option, path)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(f"{path}: cannot parse {raw!r} ({'; '.join(errors)})")
    if origin is Literal:
        choices = get_args(annotation)
        for choice in choices:
            if str(choice) == raw:
                return choice
        close = difflib.get_close_matches(raw, [str(c) for c in choices], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{path}: {raw!r} is not one of {list(choices)}.{hint}")
    if origin in (list, tuple):
        (item_type, *_) = get_args(annotation) or (Any,)
        items = _auto(raw) if raw.startswith("[") else [x for x in raw.split(",") if x]
        if not isinstance(items, list):
            raise ConfigError(f"{path}: expected a list such as [a, b] or a,b; got {raw!r}")
        return [
            parse_value(x if isinstance(x, str) else json.dumps(x), item_type, path) for x in items
        ]
    if origin is dict or annotation is dict:
        value = _auto(raw)
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a JSON object, got {raw!r}")
        return value
    if annotation is bool:
        if raw in BOOLEANS:
            return BOOLEANS[raw]
        raise ConfigError(f"{path}: expected true or false, got {raw!r}")
    if annotation in (int, float):
        try:
            number = float(raw)
        except ValueError:
            raise ConfigError(f"{path}: expected a number, got {raw!r}") from None
        if annotation is int:
            if not number.is_integer():
                raise ConfigError(f"{path}: expected an integer, got {raw!r}")
            return int(number)
        return number
    if annotation is str or annotation is Any:
        return raw
    raise ConfigError(f"{path}: cannot set a field of type {annotation} from the command line")


def to_dict(config: Any) -> Any:
    """Plain JSON-serialisable view of a (nested) config dataclass."""
    if dataclasses.is_dataclass(config):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, list | tuple):
        return [to_dict(x) for x in config]
    if isinstance(config, dict):
        return {k: to_dict(v) for k, v in config.items()}
    return config
