"""Which adapter drives which diffusers pipeline: the family registry of ``policy.name=flow_image``.

``FAMILIES`` maps a pipeline class name (``_class_name`` of a checkpoint's ``model_index.json``)
to its adapter, as a ``"module:Class"`` string (imported on first use) or the class itself;
``register_family`` adds one at run time (a notebook, a plugin, a test).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pipelines.loading import require_local_or_reachable

if TYPE_CHECKING:
    from pipelines.flow_image import FlowImagePolicy

FAMILIES: dict[str, Any] = {
    "StableDiffusion3Pipeline": "pipelines.sd3:SD3Policy",
    "FluxPipeline": "pipelines.flux:FluxPolicy",
    "SanaPipeline": "pipelines.sana:SanaPolicy",
    "WanPipeline": "pipelines.wan:WanPolicy",
    "Lumina2Pipeline": "pipelines.lumina2:Lumina2Policy",
    "QwenImagePipeline": "pipelines.qwenimage:QwenImagePolicy",
    "QwenImageEditPipeline": "pipelines.qwenimage_edit:QwenImageEditPolicy",
    "ZImagePipeline": "pipelines.zimage:ZImagePolicy",
    "ChromaPipeline": "pipelines.chroma:ChromaPolicy",
    "Flux2Pipeline": "pipelines.flux2:Flux2Policy",
    "Flux2KleinPipeline": "pipelines.flux2:Flux2KleinPolicy",
}
"""Pipeline class name -> ``"module:Class"`` or an adapter class."""


def register_family(
    adapter: type[FlowImagePolicy] | str, pipeline_class: str | None = None
) -> None:
    """Make ``policy.name=flow_image`` build ``adapter`` for checkpoints of ``pipeline_class``
    (by default the adapter class's own ``pipeline_class``).

    Args:
        adapter: a ``FlowImagePolicy`` subclass, or ``"module:Class"`` (then
            ``pipeline_class`` is required).
        pipeline_class: the diffusers pipeline class name the adapter drives.
    """
    if isinstance(adapter, str):
        if pipeline_class is None or ":" not in adapter:
            raise ValueError(
                "register_family('module:Class', pipeline_class) needs both: got "
                f"{adapter!r}, {pipeline_class!r}"
            )
    else:
        from pipelines.flow_image import FlowImagePolicy

        if not (isinstance(adapter, type) and issubclass(adapter, FlowImagePolicy)):
            raise TypeError(f"register_family needs a FlowImagePolicy subclass, got {adapter!r}")
        pipeline_class = pipeline_class or adapter.pipeline_class
        if not pipeline_class:
            raise ValueError(f"{adapter.__name__} sets no pipeline_class; pass pipeline_class=")
    FAMILIES[pipeline_class] = adapter


def family_class(pipeline_class: str) -> type[FlowImagePolicy]:
    """The adapter registered for a pipeline class name."""
    if pipeline_class not in FAMILIES:
        raise ValueError(
            f"no adapter for {pipeline_class}; supported: {', '.join(FAMILIES)} "
            "(docs/porting_a_diffusers_model.md shows how to add one; register_family adds it)"
        )
    entry = FAMILIES[pipeline_class]
    if isinstance(entry, str):
        module_name, cls_name = entry.split(":")
        entry = getattr(importlib.import_module(module_name), cls_name)
    return entry


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


def flow_image_policy(pretrained: str | None = None, **kwargs: Any) -> FlowImagePolicy:
    """Build the adapter of whatever family ``pretrained`` is (read from its
    ``model_index.json``)."""
    return flow_image_class(pretrained)(pretrained, **kwargs)


def flow_image_class(pretrained: str | None) -> type[FlowImagePolicy]:
    """The adapter class of the family ``pretrained`` belongs to."""
    if not pretrained:
        raise ValueError("policy flow_image needs policy.pretrained: a hub id or a directory")
    class_name = pipeline_class_name(pretrained)
    if class_name not in FAMILIES:
        raise ValueError(
            f"{pretrained!r} is a {class_name}; supported: {', '.join(FAMILIES)} "
            "(docs/porting_a_diffusers_model.md shows how to add one)"
        )
    return family_class(class_name)


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
    if found != pipeline_class and found in FAMILIES:
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
