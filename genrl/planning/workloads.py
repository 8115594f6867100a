"""What one rollout step and one training minibatch feed the trained module, per family.

A family (a model file's ``family``) turns the recipe's sizes into the trained module's inputs
at a batch size, as the adapter of ``pipelines/`` calls it: the latents the transformer sees at
the recipe's resolution (and frames), the text encoder's sequence, the time input; or the
token sequence of a language model. ``FAMILIES`` is the registry.

Sizes the recipe does not set come from the model file's ``defaults`` (the adapters' own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# The LoRA targets of the adapters (pipelines/diffusers/flow_image.py ATTENTION_PROJECTIONS,
# pipelines/transformers/causal_lm.py LORA_TARGETS), repeated here because the planner may not
# import pipelines/ (docs/architecture.md, section 1).
DIFFUSERS_LORA = ["to_q", "to_k", "to_v", "to_out.0"]
TRANSFORMERS_LORA = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Sizes:
    """The sizes a step runs at: ``values`` (height, width, frames, text tokens, prompt and
    completion tokens) and a one-line description for the output."""

    values: dict[str, int]
    text: str


@dataclass(frozen=True)
class Family:
    """How a family's trained module is called.

    Attributes:
        sizes: the step's sizes from the recipe's ``policy.kwargs`` (and the planner's options)
            and the model's defaults.
        inputs: the module's keyword inputs at a batch size (fake tensors when called inside a
            ``FakeTensorMode``), for training (``rollout=False``) or one rollout step.
        output: the tensor the loss reads from the module's output.
        lora_targets: the adapter's default ``lora_target_modules`` (None: every linear layer).
        guided: classifier-free guidance runs both branches in one batched forward when
            ``sampler.guidance_scale > 1`` (``pipelines/diffusers/flow_image.py``).
    """

    sizes: Callable[[dict[str, Any], dict[str, Any], dict[str, int]], Sizes]
    inputs: Callable[[nn.Module, Sizes, int, bool, torch.dtype], dict[str, Any]]
    output: Callable[[Any], torch.Tensor]
    lora_targets: list[str] | None = field(default_factory=lambda: list(DIFFUSERS_LORA))
    guided: bool = True


def _get(kwargs: dict[str, Any], defaults: dict[str, Any], key: str, fallback: int) -> int:
    return int(kwargs.get(key) or defaults.get(key) or fallback)


def _image_sizes(kwargs: dict[str, Any], defaults: dict[str, Any], _: dict[str, int]) -> Sizes:
    h, w = _get(kwargs, defaults, "height", 1024), _get(kwargs, defaults, "width", 1024)
    text = _get(kwargs, defaults, "max_sequence_length", 256)
    return Sizes({"height": h, "width": w, "text": text}, f"{h}x{w} px, {text} text tokens")


def _first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple | list) else output.sample


def _sd3_inputs(m: nn.Module, s: Sizes, b: int, _: bool, dtype: torch.dtype) -> dict[str, Any]:
    c: Any = m.config
    h, w = s.values["height"] // 8, s.values["width"] // 8
    # SD3's prompt: 77 CLIP tokens then the T5 tokens (pipeline_stable_diffusion_3.encode_prompt).
    return {
        "hidden_states": torch.randn(b, c.in_channels, h, w, dtype=dtype),
        "encoder_hidden_states": torch.randn(
            b, 77 + s.values["text"], c.joint_attention_dim, dtype=dtype
        ),
        "pooled_projections": torch.randn(b, c.pooled_projection_dim, dtype=dtype),
        "timestep": torch.full((b,), 500.0),
        "return_dict": False,
    }


def _flux_inputs(m: nn.Module, s: Sizes, b: int, _: bool, dtype: torch.dtype) -> dict[str, Any]:
    c: Any = m.config
    # FLUX packs 2x2 latent patches into tokens of 64 channels: (H/16) x (W/16) tokens.
    tokens = (s.values["height"] // 16) * (s.values["width"] // 16)
    text = s.values["text"]
    inputs = {
        "hidden_states": torch.randn(b, tokens, c.in_channels, dtype=dtype),
        "encoder_hidden_states": torch.randn(b, text, c.joint_attention_dim, dtype=dtype),
        "pooled_projections": torch.randn(b, c.pooled_projection_dim, dtype=dtype),
        "timestep": torch.full((b,), 0.5),
        "img_ids": torch.zeros(tokens, 3),
        "txt_ids": torch.zeros(text, 3),
        "return_dict": False,
    }
    if c.guidance_embeds:
        inputs["guidance"] = torch.full((b,), 3.5)
    return inputs


def _qwenimage_inputs(
    m: nn.Module, s: Sizes, b: int, _: bool, dtype: torch.dtype
) -> dict[str, Any]:
    c: Any = m.config
    h, w = s.values["height"] // 16, s.values["width"] // 16
    text = s.values["text"]
    return {
        "hidden_states": torch.randn(b, h * w, c.in_channels, dtype=dtype),
        "encoder_hidden_states": torch.randn(b, text, c.joint_attention_dim, dtype=dtype),
        "encoder_hidden_states_mask": torch.ones(b, text, dtype=torch.long),
        "timestep": torch.full((b,), 0.5),
        "img_shapes": [[(1, h, w)]] * b,
        "return_dict": False,
    }


def _video_sizes(kwargs: dict[str, Any], defaults: dict[str, Any], _: dict[str, int]) -> Sizes:
    h, w = _get(kwargs, defaults, "height", 480), _get(kwargs, defaults, "width", 832)
    frames = _get(kwargs, defaults, "num_frames", 81)
    text = _get(kwargs, defaults, "max_sequence_length", 512)
    spatial = int(defaults.get("vae_spatial", 8))
    return Sizes(
        {"height": h, "width": w, "frames": frames, "text": text, "spatial": spatial},
        f"{frames} frames of {h}x{w} px, {text} text tokens",
    )


def _wan_inputs(m: nn.Module, s: Sizes, b: int, _: bool, dtype: torch.dtype) -> dict[str, Any]:
    c: Any = m.config
    v = s.values
    # Wan's VAE: 4x temporal compression keeping the first frame, 8x (Wan 2.2 5B: 16x) spatial.
    latent_frames = (v["frames"] - 1) // 4 + 1
    h, w = v["height"] // v["spatial"], v["width"] // v["spatial"]
    return {
        "hidden_states": torch.randn(b, c.in_channels, latent_frames, h, w, dtype=dtype),
        "timestep": torch.full((b,), 500.0),
        "encoder_hidden_states": torch.randn(b, v["text"], c.text_dim, dtype=dtype),
        "return_dict": False,
    }


def _token_sizes(kwargs: dict[str, Any], defaults: dict[str, Any], tokens: dict[str, int]) -> Sizes:
    prompt, completion = tokens["prompt"], tokens["completion"]
    return Sizes(
        {"prompt": prompt, "completion": completion},
        f"{prompt} prompt + {completion} completion tokens",
    )


def _token_inputs(m: nn.Module, s: Sizes, b: int, rollout: bool, _: torch.dtype) -> dict[str, Any]:
    length = s.values["prompt"] + s.values["completion"]
    inputs: dict[str, Any] = {"input_ids": torch.zeros(b, length, dtype=torch.long)}
    if rollout:
        # Generation keeps the KV cache of the whole sequence and reads the last position's
        # logits only: one prefill of prompt + completion stands for it (same FLOPs and cache).
        inputs.update(use_cache=True, logits_to_keep=1)
    else:
        # Training scores the completion only (TransformersPolicy.completion_logits).
        inputs.update(use_cache=False, logits_to_keep=s.values["completion"])
    return inputs


def _logits(output: Any) -> torch.Tensor:
    return output.logits


FAMILIES: dict[str, Family] = {
    "sd3": Family(_image_sizes, _sd3_inputs, _first),
    "flux": Family(_image_sizes, _flux_inputs, _first),
    "qwenimage": Family(_image_sizes, _qwenimage_inputs, _first),
    "wan": Family(_video_sizes, _wan_inputs, _first),
    "causal_lm": Family(_token_sizes, _token_inputs, _logits, list(TRANSFORMERS_LORA), False),
    "masked_lm": Family(_token_sizes, _token_inputs, _logits, list(TRANSFORMERS_LORA), False),
    "vlm": Family(_token_sizes, _token_inputs, _logits, list(TRANSFORMERS_LORA), False),
}


def training_loss(output: torch.Tensor, tokens: bool) -> torch.Tensor:
    """A scalar standing for the objective's loss: flow objectives regress the velocity
    (a float32 square error), token objectives take log-softmax probabilities of the sampled
    tokens in float32 (``pipelines/transformers/base.py`` ``token_log_probs``)."""
    if tokens:
        log_probs = output.float().log_softmax(-1)
        return log_probs[..., 0].mean()
    return output.float().pow(2).mean()
