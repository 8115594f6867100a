"""Modality adapters: one file per model family, built by name from the policy registry."""

from __future__ import annotations

import importlib
from typing import Any

# name -> "module:Class" (imported only when built, so heavy libraries load on demand) or a class.
POLICIES: dict[str, Any] = {
    "toy_digits": "pipelines.toy.policy:ToyDigitsPolicy",
    "toy_video_digits": "pipelines.toy.video_policy:ToyVideoDigitsPolicy",
    "toy_compositional": "pipelines.toy.compositional_policy:ToyCompositionalPolicy",
    # Diffusers flow-matching text-to-image and text-to-video models; flow_image reads the
    # family from the checkpoint's model_index.json.
    "flow_image": "pipelines.diffusers.flow_families:flow_image_policy",  # class: RESOLVERS
    "sd3": "pipelines.diffusers.sd3:SD3Policy",
    "flux": "pipelines.diffusers.flux:FluxPolicy",
    "sana": "pipelines.diffusers.sana:SanaPolicy",
    "lumina2": "pipelines.diffusers.lumina2:Lumina2Policy",
    "qwenimage": "pipelines.diffusers.qwenimage:QwenImagePolicy",
    "qwenimage_edit": "pipelines.diffusers.qwenimage_edit:QwenImageEditPolicy",  # + a reference image
    "zimage": "pipelines.diffusers.zimage:ZImagePolicy",
    "chroma": "pipelines.diffusers.chroma:ChromaPolicy",
    "flux2": "pipelines.diffusers.flux2:Flux2Policy",
    "flux2_klein": "pipelines.diffusers.flux2:Flux2KleinPolicy",
    "wan": "pipelines.diffusers.wan:WanPolicy",  # text-to-video
    # Diffusers epsilon / v-prediction UNet models, sampled with DDIM.
    "sd": "pipelines.diffusers.sd:StableDiffusionPolicy",
    "sdxl": "pipelines.diffusers.sdxl:StableDiffusionXLPolicy",
    # Masked image-token generators (MaskGRPO on images).
    "amused": "pipelines.diffusers.amused:AmusedPolicy",
    "compositional_discrete": "pipelines.diffusers.amused:compositional_discrete",  # embedded
    "ltx": "pipelines.diffusers.ltx:LTXPolicy",  # text-to-video
    "hunyuan_video15": "pipelines.diffusers.hunyuan_video15:HunyuanVideo15Policy",  # text-to-video
    # Token policies.
    "causal_lm": "pipelines.transformers.causal_lm:CausalLMPolicy",
    "countdown_lm": "pipelines.transformers.causal_lm:countdown_lm",
    "masked_lm": "pipelines.transformers.masked_lm:MaskedLMPolicy",
    "sudoku_dllm": "pipelines.transformers.masked_lm:sudoku_dllm",
    "vlm": "pipelines.transformers.vlm:VLMPolicy",  # vision-language models (prompts carry images)
    "shapes_vlm": "pipelines.transformers.vlm:shapes_vlm",
}


# name -> "module:function" giving the class of a checkpoint (its family's adapter).
RESOLVERS: dict[str, str] = {"flow_image": "pipelines.diffusers.flow_families:flow_image_class"}


def policy_class(name: str, pretrained: str | None = None) -> Any:
    """The class (or factory) registered as ``name``, imported on first use; for a name whose
    class depends on the checkpoint (``flow_image``), the class of ``pretrained``'s family.
    Every adapter takes ``pretrained`` and the keywords ``dtype`` and
    ``gradient_checkpointing``, plus its own (``policy.kwargs``)."""
    if name in RESOLVERS:
        module_name, function = RESOLVERS[name].split(":")
        return getattr(importlib.import_module(module_name), function)(pretrained)
    if name not in POLICIES:
        import difflib

        close = difflib.get_close_matches(name, list(POLICIES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown policy {name!r}.{hint} Known: {', '.join(POLICIES)}")
    entry = POLICIES[name]
    if isinstance(entry, str):
        module_name, cls_name = entry.split(":")
        entry = getattr(importlib.import_module(module_name), cls_name)
    return entry


def build_policy(name: str, /, **kwargs: Any) -> Any:
    """Instantiate the adapter registered as ``name``."""
    return policy_class(name, kwargs.get("pretrained"))(**kwargs)
