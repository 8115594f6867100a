"""Flow-matching text-to-image and text-to-video models from diffusers as policies: the shared part.

One adapter per model family (``pipelines/diffusers/sd3.py``, ``flux.py``, ``sana.py``, ``wan.py``,
``lumina2.py``, ``qwenimage.py``) supplies prompt encoding and the transformer's inputs, and
declares what its stock pipeline does differently through the hooks of ``FlowImagePolicy`` (the
guidance rule, the time input and prediction sign, latent normalisation and packing, masked
prompt embeddings of varying length; ``pipelines/diffusers/flow_hooks.py``); this base class does
everything else the same way for all of them:

* loads the stock pipeline with diffusers' own ``from_pretrained`` (hub id or local directory);
* encodes each distinct prompt once per batch and reuses the embedding across its group;
* classifier-free guidance in one batched forward with the unconditional branch detached
  (``FlowPolicy.velocity``), combined by the family's rule (``Guidance``);
* LoRA through peft on the attention projections (reference policy = adapter disabled, no second
  copy) or full fine-tuning, gradient checkpointing, low-precision frozen weights;
* the noise schedule of the pipeline's own scheduler, so that an ODE rollout reproduces
  ``pipe(...)``;
* videos: a pipeline whose ``__call__`` takes ``num_frames`` is a video pipeline; its latents
  are ``[C, F', H', W']`` from the VAE's own spatial and temporal compression
  (``flow_hooks.vae_compression``), optionally as the transformer's patch tokens
  (``latent_tokens``), decoded to ``[B, F, 3, H, W]``, with the decode timestep and noise of
  timestep-conditioned VAEs;
* export as diffusers LoRA weights (``pipe.load_lora_weights(dir)``) or ``save_pretrained``.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from pipelines.base import Condition, FlowPolicy
from pipelines.diffusers.checkpoint import load_pipeline
from pipelines.diffusers.flow_hooks import (
    Guidance,
    check_divisible,
    join_padded,
    pipeline_modules,
    place_frozen,
)
from pipelines.diffusers.flow_layout import LatentLayout
from tasks.prompt import prompt_id

__all__ = ["FlowImagePolicy", "check_divisible"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Attention projections of the MM-DiT (SD3, FLUX) and linear-attention DiT (SANA) blocks:
# Flow-GRPO's LoRA targets. peft matches a module whose name ends with one of these.
ATTENTION_PROJECTIONS = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
]


class FlowImagePolicy(LatentLayout, FlowPolicy):
    """A diffusers flow-matching text-to-image pipeline as a policy.

    Args:
        pretrained: hub id or local directory of the pipeline (``save_pretrained`` layout).
        height, width: image size in pixels; None uses the model's native resolution (the
            pipeline's ``default_sample_size``, else the call's ``height`` / ``width`` defaults).
        num_frames: frames per video, for pipelines whose call takes ``num_frames``; ``num_frames
            - 1`` must be a multiple of the VAE's temporal compression. None: the call's
            default. An error for image pipelines.
        frame_rate: frames per second, for pipelines whose call takes ``frame_rate`` (LTX-Video's
            position encoding depends on it); None: the call's default.
        decode_timestep, decode_noise_scale: for timestep-conditioned VAEs (LTX-Video 0.9.1+),
            the decoder's timestep and the weight of the noise blended into the latents before
            decoding (``flow_hooks.decode_noise``; None: the call's defaults, and the noise
            scale then equals the timestep). Ignored by other VAEs.
        decode_noise_seed: seed of that decode noise, drawn anew for each decoded batch.
        dtype: storage dtype of the frozen weights (``float32``, ``bfloat16``, ``float16``);
            trainable LoRA weights stay float32.
        gradient_checkpointing: recompute transformer activations in the backward pass.
        negative_prompt: the unconditional prompt of classifier-free guidance.
        max_sequence_length: tokens of the long-context text encoder (T5 for SD3 and FLUX,
            Gemma for SANA); None uses the pipeline's default (SD3: 256, FLUX: 512, SANA: 300).
            Flow-GRPO's SD3 and FLUX scripts encode with 128. SD3's condition is the 77 CLIP
            tokens followed by these, so its text sequence is ``77 + max_sequence_length``.
        detach_uncond: with CFG, stop gradients through the unconditional branch (genrl's
            default); False trains both branches, as Flow-GRPO's scripts do.
        cfg_normalization: rescale the guided velocity to the conditional one's norm
            (``Guidance.normalize``); None keeps the family's default (on for QwenImage and
            Lumina2, as their pipelines do, off elsewhere).
        cfg_cutoff_sigma: no CFG at noise levels below this (``Guidance.cutoff_sigma``; 0: CFG
            at every step).
        guidance_rescale: ``phi`` of Lin et al.'s CFG rescale (``Guidance.rescale``; 0: off,
            the stock pipelines' default), the stock call's ``guidance_rescale``.
        embedded_guidance: value fed to the guidance embedding of guidance-distilled models
            (FLUX.1-dev: 3.5 by default); ignored by transformers without one.
        lora_init: peft's ``init_lora_weights`` (True: peft's default; ``"gaussian"``:
            Flow-GRPO's and DiffusionNFT's).
        pipeline: an already built pipeline instead of ``pretrained`` (tests, notebooks).
    """

    pipeline_class: ClassVar[str] = ""
    """Class name in ``diffusers`` this adapter drives (checked on load)."""
    default_guidance: ClassVar[Guidance] = Guidance()
    """The stock pipeline's CFG rule (plain CFG unless the family's pipeline differs)."""
    default_embedded_guidance: ClassVar[float | None] = None
    """Guidance-embedding value of distilled models when ``embedded_guidance`` is not given."""
    time_input: ClassVar[str] = "timesteps"
    """What the transformer's ``timestep`` is for noise level ``s`` (see ``model_time``):
    ``"timesteps"`` ``1000 s`` (SD3, SANA, Wan), ``"sigma"`` ``1000 s`` rounded to the model
    dtype then divided by 1000 (FLUX, QwenImage), ``"reversed"`` ``1 - 1000 s / 1000``
    (Lumina2, whose time runs from 0 at noise to 1 at the image)."""
    prediction_sign: ClassVar[float] = 1.0
    """-1 when the transformer predicts minus the velocity ``eps - x0`` (Lumina2)."""
    sequence_masks: ClassVar[dict[str, str]] = {}
    """``{embedding key: mask key}`` of prompt embeddings whose length varies from batch to
    batch (padded to the longest prompt, not to a fixed width): CFG pads the conditional and
    unconditional ones to a common length, masked out."""

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        height: int | None = None,
        width: int | None = None,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        negative_prompt: str = "",
        max_sequence_length: int | None = None,
        detach_uncond: bool = True,
        lora_init: bool | str = True,
        cfg_normalization: bool | None = None,
        cfg_cutoff_sigma: float = 0.0,
        guidance_rescale: float = 0.0,
        embedded_guidance: float | None = None,
        num_frames: int | None = None,
        frame_rate: float | None = None,
        decode_timestep: float | None = None,
        decode_noise_scale: float | None = None,
        decode_noise_seed: int = 0,
        pipeline: Any = None,
    ) -> None:
        super().__init__()
        self.detach_uncond = detach_uncond
        self.guidance = Guidance(
            normalize=(
                self.default_guidance.normalize if cfg_normalization is None else cfg_normalization
            ),
            cutoff_sigma=cfg_cutoff_sigma or self.default_guidance.cutoff_sigma,
            rescale=guidance_rescale,
        )
        self.embedded_guidance = (
            self.default_embedded_guidance if embedded_guidance is None else embedded_guidance
        )
        self.lora_init = lora_init
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.dtype = DTYPES[dtype]
        self.pipe = pipeline if pipeline is not None else self._load(pretrained, self.dtype)
        self._check_pipeline_class()
        self.negative_prompt = negative_prompt
        self.max_sequence_length = (
            max_sequence_length
            or self._call_default("max_sequence_length", None)
            or getattr(self.pipe, "tokenizer_max_length", None)
            or 256
        )
        self.num_frames = self._num_frames(num_frames)
        self.frame_rate = frame_rate or self._call_default("frame_rate", None)
        self.decode_timestep = (
            self._call_default("decode_timestep", 0.0)
            if decode_timestep is None
            else decode_timestep
        )
        self.decode_noise_scale = (
            self._call_default("decode_noise_scale", None)
            if decode_noise_scale is None
            else decode_noise_scale
        )
        self.decode_noise_seed = decode_noise_seed
        transformer = self.pipe.transformer
        if gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        for component in self._components().values():
            component.requires_grad_(False).eval()
        self.network: nn.Module = transformer
        self.module = transformer
        # Input dtype of the transformer, read once: diffusers' ``ModelMixin.dtype`` walks every
        # submodule (8 ms per call on SD3.5-medium with LoRA), and forwards happen per step.
        self.model_dtype: torch.dtype = transformer.dtype
        self.height, self.width = self._image_size(height, width)
        self.latent_shape = self._latent_shape(self.height, self.width)
        self._null: Condition | None = None

    # -- family hooks ----------------------------------------------------------------------------
    @abc.abstractmethod
    def _encode(self, prompts: list[str]) -> Condition:
        """Embeddings of distinct prompts, ``[U, ...]`` per key."""

    def _encode_negative(self) -> Condition:
        """The unconditional embedding, ``[1, ...]`` per key (by default the negative prompt
        encoded like a prompt, as FLUX, Wan and QwenImage do)."""
        return self._encode([self.negative_prompt])

    @abc.abstractmethod
    def _model_inputs(
        self, latents: torch.Tensor, time: torch.Tensor, condition: Condition
    ) -> dict[str, Any]:
        """Keyword arguments of the transformer call (without ``return_dict``) for latents and
        condition already in the model dtype and the time input ``model_time(sigma)``."""

    def _model_output(self, output: torch.Tensor) -> torch.Tensor:
        """The transformer's float32 output -> the prediction (e.g. dropping a learned
        variance); before ``prediction_sign``."""
        return output

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def _load(cls, pretrained: str | None, dtype: torch.dtype) -> Any:
        return load_pipeline(cls.pipeline_class, cls.__name__, pretrained, dtype)

    def _check_pipeline_class(self) -> None:
        names = {c.__name__ for c in type(self.pipe).__mro__}
        if self.pipeline_class not in names:
            raise ValueError(
                f"{type(self).__name__} drives a {self.pipeline_class}, got a "
                f"{type(self.pipe).__name__} (use policy.name=flow_image to detect the family)"
            )

    def _components(self) -> dict[str, nn.Module]:
        """Every torch module of the pipeline."""
        return pipeline_modules(self.pipe)

    def _place(self) -> None:
        """Keep the frozen components on the transformer's device (``place_frozen``)."""
        place_frozen(self.pipe, "transformer", self.device)

    # -- FlowPolicy ------------------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Condition:
        """Each distinct prompt (``prompt_id``: its text, and its dataset row when it has one,
        since rows of one text may carry different reference images) is encoded once; its rows
        are repeated for its group."""
        self._place()
        ids = [prompt_id(p) for p in prompts]
        first = {key: i for i, key in reversed(list(enumerate(ids)))}
        order = list(dict.fromkeys(ids))
        index = torch.tensor([order.index(key) for key in ids], device=self.device)
        encoded = self._encode([prompts[first[key]] for key in order])
        return {k: v[index] for k, v in encoded.items()}

    def null_condition(self, condition: Condition) -> Condition:
        """The negative prompt's encoding, computed once (and again if the model moved)."""
        null = self._null
        if null is None or next(iter(null.values())).device != self.device:
            self._place()
            with torch.no_grad():
                null = self._null = self._encode_negative()
        n = next(iter(condition.values())).shape[0]
        return {k: v.expand(n, *v.shape[1:]) for k, v in null.items()}

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        self._place()
        vae = self.pipe.vae
        images = self._decode_latents(latents.to(vae.device, vae.dtype))
        return (images.float() / 2 + 0.5).clamp(0, 1)

    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Clean latents -> VAE output in ``[-1, 1]``: unpacked, un-normalised, decoded."""
        vae_latents, extra = self._decode_inputs(self.denormalize(self._to_vae_layout(latents)))
        return self._from_vae(self.pipe.vae.decode(vae_latents, **extra, return_dict=False)[0])

    def sigma_schedule(self, num_steps: int, shift: float | None = None) -> torch.Tensor:
        """The pipeline scheduler's sigmas for ``num_steps`` (``shift=None``), or a linear
        schedule with the given static shift."""
        if shift is not None:
            return super().sigma_schedule(num_steps, shift)
        from diffusers import FlowMatchEulerDiscreteScheduler

        # A fresh Euler scheduler from the pipeline's config: the same sigmas as pipe(...) when
        # the pipeline uses this scheduler, without touching the pipeline's own instance.
        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.pipe.scheduler.config)
        scheduler.set_timesteps(num_steps, **self._scheduler_kwargs(num_steps))
        return scheduler.sigmas.float().cpu()

    def timesteps(self, sigma: torch.Tensor) -> torch.Tensor:
        """The scheduler's timesteps for noise level ``sigma`` (diffusers schedulers use
        ``1000 s``)."""
        return sigma.float() * self.pipe.scheduler.config.num_train_timesteps

    def model_time(self, sigma: torch.Tensor) -> torch.Tensor:
        """The transformer's time input for noise levels ``sigma`` ``[B]`` (``time_input``)."""
        timesteps = self.timesteps(sigma)
        if self.time_input == "timesteps":
            return timesteps
        scale = self.pipe.scheduler.config.num_train_timesteps
        if self.time_input == "sigma":
            return timesteps.to(self.model_dtype) / scale
        if self.time_input == "reversed":
            return 1 - timesteps / scale
        raise ValueError(f"unknown time_input {self.time_input!r} of {type(self).__name__}")

    def forward_model(
        self, module: nn.Module, latents: torch.Tensor, sigma: torch.Tensor, condition: Condition
    ) -> torch.Tensor:
        """Velocity (float32) of ``module`` (the peft/DDP wrapper or the frozen reference)."""
        dtype = self.model_dtype
        typed = {k: v.to(dtype) if v.is_floating_point() else v for k, v in condition.items()}
        inputs = self._model_inputs(latents.to(dtype), self.model_time(sigma), typed)
        raw = module(**inputs, return_dict=False)[0]
        if isinstance(raw, list | tuple):  # one tensor per sample (Z-Image)
            raw = torch.stack(list(raw))
        out = self._model_output(raw.float())
        return -out if self.prediction_sign < 0 else out

    def embedded_guidance_input(self, n: int) -> torch.Tensor | None:
        """``[n]`` guidance-embedding values for distilled transformers, None without one."""
        if not self.pipe.transformer.config.get("guidance_embeds", False):
            return None
        if self.embedded_guidance is None:
            raise ValueError(
                f"{type(self).__name__}: the transformer is guidance-distilled; set "
                "policy.kwargs.embedded_guidance"
            )
        return torch.full((n,), float(self.embedded_guidance), device=self.device)

    def join_conditions(self, condition: Condition, null: Condition) -> Condition:
        return join_padded(condition, null, self.sequence_masks)

    def guidance_active(self, sigma: torch.Tensor) -> bool:
        return self.guidance.active(sigma)

    def combine_guidance(
        self, cond: torch.Tensor, uncond: torch.Tensor, sigma: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """The family's CFG rule (``self.guidance``: plain, norm-rescaled, cut off)."""
        return self.guidance.combine(cond, uncond, sigma, scale)

    def default_lora_targets(self) -> list[str]:
        return list(ATTENTION_PROJECTIONS)

    def setup_training(self, rank: int, alpha: float, target_modules: list[str] | None) -> None:
        super().setup_training(rank, alpha, target_modules)
        # Trainable weights in float32 whatever the base dtype: the optimizer's updates of
        # ~1e-4 relative size would round away in bf16.
        self.trainable_in_float32()
        self.model_dtype = self.pipe.transformer.dtype

    # -- export ----------------------------------------------------------------------------------
    def export(self, directory: str | Path) -> Path:
        """LoRA: diffusers LoRA weights (``pipe.load_lora_weights(directory)`` on the stock
        pipeline reproduces our samples). Full fine-tune: the transformer's ``save_pretrained``
        in ``directory/transformer`` (load it and pass ``transformer=`` to the pipeline)."""
        from pipelines.diffusers.flow_export import export_diffusers

        return export_diffusers(self, directory)
