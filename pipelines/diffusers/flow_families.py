"""Which adapter drives which diffusers pipeline: the family registry of ``policy.name=flow_image``.

``FAMILIES`` maps a pipeline class name (``_class_name`` of a checkpoint's ``model_index.json``)
to its adapter, as a ``"module:Class"`` string (imported on first use) or the class itself;
``register_family`` adds one at run time (a notebook, a plugin, a test).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pipelines.diffusers.checkpoint import pipeline_class_name

if TYPE_CHECKING:
    from pipelines.diffusers.flow_image import FlowImagePolicy

FAMILIES: dict[str, Any] = {
    "StableDiffusion3Pipeline": "pipelines.diffusers.sd3:SD3Policy",
    "FluxPipeline": "pipelines.diffusers.flux:FluxPolicy",
    "SanaPipeline": "pipelines.diffusers.sana:SanaPolicy",
    "WanPipeline": "pipelines.diffusers.wan:WanPolicy",
    "LTXPipeline": "pipelines.diffusers.ltx:LTXPolicy",
    "HunyuanVideo15Pipeline": "pipelines.diffusers.hunyuan_video15:HunyuanVideo15Policy",
    "Lumina2Pipeline": "pipelines.diffusers.lumina2:Lumina2Policy",
    "QwenImagePipeline": "pipelines.diffusers.qwenimage:QwenImagePolicy",
    "QwenImageEditPipeline": "pipelines.diffusers.qwenimage_edit:QwenImageEditPolicy",
    "ZImagePipeline": "pipelines.diffusers.zimage:ZImagePolicy",
    "ChromaPipeline": "pipelines.diffusers.chroma:ChromaPolicy",
    "Flux2Pipeline": "pipelines.diffusers.flux2:Flux2Policy",
    "Flux2KleinPipeline": "pipelines.diffusers.flux2:Flux2KleinPolicy",
}


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
        from pipelines.diffusers.flow_image import FlowImagePolicy

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
