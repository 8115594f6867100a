"""Reading a diffusers checkpoint: the pipeline class its ``model_index.json`` records, and the
stock pipeline's own ``from_pretrained`` with one-line errors. (Which adapter drives which
pipeline class is ``FAMILIES`` in ``flow_families.py``.)"""

from __future__ import annotations

from typing import Any

from loading.hub import require_local_or_reachable

"""Pipeline class name -> ``"module:Class"`` or an adapter class."""


def pipeline_class_name(pretrained: str) -> str:
    """The pipeline class recorded in a checkpoint's ``model_index.json`` (the first file any
    build reads, so the offline check happens here)."""
    from diffusers import DiffusionPipeline

    require_local_or_reachable(
        pretrained, "--set policy.pretrained=DIR (a directory written by save_pretrained)"
    )
    try:
        return str(DiffusionPipeline.load_config(pretrained)["_class_name"])
    except (OSError, ValueError, KeyError) as err:
        first_line = (str(err).strip().splitlines() or [repr(err)])[0]
        raise ValueError(
            f"cannot read the pipeline config of {pretrained!r}: {first_line}"
        ) from err


def load_pipeline(pipeline_class: str, adapter: str, pretrained: str | None, dtype: Any) -> Any:
    """The stock ``pipeline_class`` loaded with its own ``from_pretrained`` for ``adapter``,
    with clear errors for a missing path, another family's checkpoint or a failed load."""
    if not pretrained:
        raise ValueError(
            f"{adapter} needs policy.pretrained: a hub id or a local directory of a "
            f"diffusers {pipeline_class}"
        )
    import warnings

    import diffusers

    found = pipeline_class_name(pretrained)
    if found != pipeline_class:
        raise ValueError(
            f"{pretrained!r} holds a {found}, but {adapter} drives a {pipeline_class} "
            "(policy.name=flow_image picks the family itself)"
        )
    try:
        with warnings.catch_warnings():
            # Newer diffusers rename torch_dtype to dtype; the old name works everywhere.
            warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
            return getattr(diffusers, pipeline_class).from_pretrained(pretrained, torch_dtype=dtype)
    except (OSError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
        raise ValueError(f"cannot load {pretrained!r} as a {pipeline_class}: {first_line}") from err
