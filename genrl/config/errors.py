"""The error every config mistake raises, and the message for an unknown key or name."""

from __future__ import annotations

import difflib


class ConfigError(ValueError):
    """A user-facing configuration mistake (unknown key, bad value, inconsistent settings)."""


def unknown_message(name: str, valid: list[str], path: str, *, value: bool = False) -> str:
    """Message for an unknown key (or, with ``value=True``, an unknown registry name)."""
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    if not close:
        # Abbreviations difflib cannot see: "learning_rate" -> "lr", "max_norm" -> "max_grad_norm".
        initials = "".join(word[:1] for word in name.split("_"))
        close = [v for v in valid if v == initials or (len(v) > 2 and (v in name or name in v))]
    hint = f" Did you mean {close[0]!r}?" if close else ""
    if value:
        return f"{path}: unknown name {name!r}.{hint} Known: {', '.join(sorted(valid))}"
    return f"unknown config key {path!r}.{hint} Valid keys here: {', '.join(sorted(valid))}"
