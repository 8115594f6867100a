"""Optional libraries: which genrl extra installs each, and the one-line error for a missing one.

A missing ``diffusers`` would otherwise be a long import traceback; the builders of adapters
(``pipelines/``) and rewards (``reward_models/``) turn an ``ImportError`` of an optional library
into ``MissingExtraError`` with ``missing_extra``.
"""

from __future__ import annotations

# The optional library -> the genrl extra that installs it (pyproject.toml).
EXTRAS = {
    "diffusers": "diffusers",
    "open_clip": "rewards",
    "timm": "rewards",
}
# transformers comes with both extras: adapters need it with diffusers, rewards with the rest.
SHARED = {"transformers"}
# Libraries of the base install that an install can still lack: torch installed on its own
# from another index (PyTorch's CPU wheels) without its torchvision, or genrl installed with
# --no-deps. No extra brings them back; the package itself does.
BASE = {
    "torchvision": "pip install torchvision (the release paired with your torch; "
    "constraints.txt pins torch 2.14.1 with torchvision 0.29.1)",
}


class MissingExtraError(ImportError):
    """An optional library that a policy or reward needs is not installed."""


def missing_extra(err: ImportError, what: str, extra: str) -> MissingExtraError | None:
    """``MissingExtraError`` for an ``ImportError`` of one of genrl's optional libraries, or of
    a base library the install lacks (None for any other import error).

    Args:
        err: the import error, as raised while building ``what``.
        what: what was being built, e.g. ``policy 'sd3'``.
        extra: the extra that brings ``transformers`` in this context (``diffusers`` for
            adapters, ``rewards`` for reward models).
    """
    module = (err.name or "").partition(".")[0]
    if module in BASE:
        return MissingExtraError(
            f"{what} needs {module!r}, which is not installed (genrl depends on it): "
            f"{BASE[module]}",
            name=module,
        )
    if module in SHARED:
        name = extra
    elif module in EXTRAS:
        name = EXTRAS[module]
    else:
        return None
    return MissingExtraError(
        f'{what} needs {module!r}, which is not installed: pip install "genrl[{name}]"',
        name=module,
    )
