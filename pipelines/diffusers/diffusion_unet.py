"""Classic (epsilon / v-prediction) diffusers UNet pipelines as policies: the shared part.

Stable Diffusion 1.x / 2.x (``sd.py``) and SDXL (``sdxl.py``) denoise with a
``UNet2DConditionModel`` that predicts the noise, ``v`` or the clean sample at a discrete
timestep, and are sampled here with DDIM (``samplers/ddim.py``: DDPO's sampler), on a
``DDIMScheduler`` built from the pipeline's own scheduler config as DDPO does
(``DDIMScheduler.from_config(pipe.scheduler.config)``). A family supplies prompt encoding and
the UNet's extra inputs; this base does the rest the same way for both:

* loads the stock pipeline with diffusers' ``from_pretrained`` (``checkpoint.load_pipeline``);
* encodes each distinct prompt once per batch;
* classifier-free guidance in one batched forward, unconditional rows first as the stock
  pipelines batch them, with the unconditional branch detached by default;
* LoRA through peft on the UNet's attention projections (DDPO's targets), or full fine-tuning;
* the DDIM schedule (``ddim_schedule``), so that a DDIM rollout at eta = 0 reproduces
  ``pipe(...)`` with a ``DDIMScheduler``;
* export as diffusers LoRA weights (``pipe.load_lora_weights(dir)``) or the UNet's
  ``save_pretrained``.

The policy contract is ``DiffusionPolicy`` of ``genrl/policies/protocols.py``.
"""

from __future__ import annotations

import abc
import inspect
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from torch import nn

from pipelines.base import Condition, TrainablePolicy
from pipelines.diffusers.checkpoint import load_pipeline
from pipelines.diffusers.flow_export import _lora_metadata
from pipelines.diffusers.flow_hooks import (
    check_divisible,
    pipeline_modules,
    place_frozen,
)
from samplers.ddim import DDIMSchedule
from tasks.prompt import prompt_id

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# The UNet's attention projections (self- and cross-attention): DDPO's LoRA targets (its
# train.py adds a LoRA attention processor to every attention layer of the UNet).
UNET_ATTENTION_PROJECTIONS = ["to_q", "to_k", "to_v", "to_out.0"]


class DiffusionUNetPolicy(TrainablePolicy, abc.ABC):
    """A diffusers epsilon / v-prediction text-to-image pipeline as a policy.

    Args:
        pretrained: hub id or local directory of the pipeline (``save_pretrained`` layout).
        height, width: image size in pixels; None uses the UNet's native resolution
            (``unet.config.sample_size * vae_scale_factor``, as the stock pipelines do).
        dtype: storage dtype of the frozen weights; trainable LoRA weights stay float32.
        gradient_checkpointing: recompute UNet activations in the backward pass.
        negative_prompt: the unconditional prompt of classifier-free guidance ("" as the
            stock pipelines' default; SDXL's empty negative prompt is its zero embedding).
        detach_uncond: with CFG, stop gradients through the unconditional branch (genrl's
            default); False trains both branches, as DDPO's train.py does.
        lora_init: peft's ``init_lora_weights``.
        pipeline: an already built pipeline instead of ``pretrained`` (tests, notebooks).
    """

    pipeline_class: ClassVar[str] = ""
    """Class name in ``diffusers`` this adapter drives (checked on load)."""
    upcast_vae: ClassVar[bool] = False
    """Keep a float16 checkpoint's VAE in float32 when its config says ``force_upcast``, as
    the family's stock pipeline decodes (SDXL: its VAE overflows in float16)."""

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        height: int | None = None,
        width: int | None = None,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        negative_prompt: str = "",
        detach_uncond: bool = True,
        lora_init: bool | str = True,
        pipeline: Any = None,
    ) -> None:
        super().__init__()
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.dtype = DTYPES[dtype]
        self.detach_uncond = detach_uncond
        self.lora_init = lora_init
        self.negative_prompt = negative_prompt
        self.pipe = pipeline if pipeline is not None else self._load(pretrained, self.dtype)
        names = {c.__name__ for c in type(self.pipe).__mro__}
        if self.pipeline_class not in names:
            raise ValueError(
                f"{type(self).__name__} drives a {self.pipeline_class}, got a "
                f"{type(self.pipe).__name__}"
            )
        unet = self.pipe.unet
        if unet.config.get("time_cond_proj_dim") is not None:
            raise ValueError(
                f"{type(self).__name__}: the UNet takes a guidance embedding (an LCM / distilled "
                "model, time_cond_proj_dim set); DDIM sampling of it is not supported"
            )
        if gradient_checkpointing:
            unet.enable_gradient_checkpointing()
        for component in self._components().values():
            component.requires_grad_(False).eval()
        vae = self.pipe.vae
        if self.upcast_vae and vae.dtype == torch.float16 and vae.config.get("force_upcast"):
            vae.to(torch.float32)
        self.network: nn.Module = unet
        self.module = unet
        self.model_dtype: torch.dtype = unet.dtype
        factor = self.pipe.vae_scale_factor
        default = unet.config.sample_size * factor
        self.height, self.width = height or default, width or default
        check_divisible(self.height, self.width, factor, self.pipeline_class)
        self.latent_shape: tuple[int, ...] = (
            unet.config.in_channels,
            self.height // factor,
            self.width // factor,
        )
        self._null: Condition | None = None

    # -- family hooks ----------------------------------------------------------------------------
    @abc.abstractmethod
    def _encode(self, prompts: list[str]) -> Condition:
        """Embeddings of distinct prompts, ``[U, ...]`` per key."""

    @abc.abstractmethod
    def _encode_negative(self) -> Condition:
        """The unconditional embedding, ``[1, ...]`` per key."""

    @abc.abstractmethod
    def _unet_inputs(self, condition: Condition) -> dict[str, Any]:
        """The UNet's keyword arguments besides the latents and the timestep, for a condition
        already in the model dtype."""

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def _load(cls, pretrained: str | None, dtype: torch.dtype) -> Any:
        return load_pipeline(cls.pipeline_class, cls.__name__, pretrained, dtype)

    def _components(self) -> dict[str, nn.Module]:
        """Every torch module of the pipeline."""
        return pipeline_modules(self.pipe)

    def _place(self) -> None:
        """Keep the frozen components on the unet's device (``place_frozen``)."""
        place_frozen(self.pipe, "unet", self.device)

    # -- DiffusionPolicy -------------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Condition:
        """Each distinct prompt encoded once, its rows repeated for its group."""
        self._place()
        ids = [prompt_id(p) for p in prompts]
        order = list(dict.fromkeys(ids))
        first = {key: prompts[ids.index(key)] for key in order}
        index = torch.tensor([order.index(key) for key in ids], device=self.device)
        encoded = self._encode([first[key] for key in order])
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

    def forward_model(
        self,
        module: nn.Module,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        condition: Condition,
    ) -> torch.Tensor:
        """The UNet's float32 prediction of ``module`` (the peft/DDP wrapper or the frozen
        reference) at timesteps ``[B]``."""
        dtype = self.model_dtype
        typed = {k: v.to(dtype) if v.is_floating_point() else v for k, v in condition.items()}
        out = module(latents.to(dtype), timesteps, return_dict=False, **self._unet_inputs(typed))[0]
        return out.float()

    def predict(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        condition: Condition,
        guidance_scale: float = 1.0,
    ) -> torch.Tensor:
        """The model's prediction (its scheduler's ``prediction_type``) with plain CFG
        ``p_u + g (p_c - p_u)`` when ``g != 1``, both branches in one forward with the
        unconditional rows first, as ``StableDiffusionPipeline`` and ``...XLPipeline`` do."""
        module = self._active_module()
        if guidance_scale == 1.0:
            return self.forward_model(module, latents, timesteps, condition)
        null = self.null_condition(condition)
        both = self.forward_model(
            module,
            torch.cat([latents, latents]),
            torch.cat([timesteps, timesteps]),
            {k: torch.cat([null[k], condition[k]]) for k in condition},
        )
        uncond, cond = both.chunk(2)
        if self.detach_uncond:
            uncond = uncond.detach()
        return uncond + guidance_scale * (cond - uncond)

    def ddim_schedule(self, num_steps: int) -> DDIMSchedule:
        """DDIM's timesteps and alphas for ``num_steps`` from a ``DDIMScheduler`` built on the
        pipeline's scheduler config (the pipeline's own instance is left untouched)."""
        from diffusers import DDIMScheduler

        scheduler = DDIMScheduler.from_config(self.pipe.scheduler.config)
        scheduler.set_timesteps(num_steps)
        if scheduler.config.thresholding:
            raise ValueError(
                f"{type(self).__name__}: the scheduler thresholds x0 (dynamic thresholding), "
                "which the DDIM sampler does not implement"
            )
        return DDIMSchedule(
            timesteps=scheduler.timesteps.clone(),
            alphas_cumprod=scheduler.alphas_cumprod.float().clone(),
            final_alpha_cumprod=float(scheduler.final_alpha_cumprod),
            prediction_type=scheduler.config.prediction_type,
            clip_sample=bool(scheduler.config.clip_sample),
            clip_sample_range=float(scheduler.config.clip_sample_range),
        )

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Clean latents -> images in ``[0, 1]``: un-scaled (and un-shifted by the VAE's
        ``latents_mean`` / ``latents_std`` where it has them, as SDXL's pipeline does), decoded."""
        self._place()
        vae = self.pipe.vae
        latents = latents.to(vae.device, vae.dtype)
        config = vae.config
        mean, std = config.get("latents_mean"), config.get("latents_std")
        if mean is not None and std is not None:
            shape = (1, len(mean), 1, 1)
            mean_t = torch.tensor(mean).view(shape).to(latents)
            std_t = torch.tensor(std).view(shape).to(latents)
            latents = latents * std_t / config.scaling_factor + mean_t
        else:
            latents = latents / config.scaling_factor
        images = vae.decode(latents, return_dict=False)[0]
        return (images.float() / 2 + 0.5).clamp(0, 1)

    def call_default(self, name: str, fallback: Any) -> Any:
        """Default of a ``pipe(...)`` argument."""
        parameter = inspect.signature(type(self.pipe).__call__).parameters.get(name)
        return fallback if parameter is None else parameter.default

    # -- training --------------------------------------------------------------------------------
    def default_lora_targets(self) -> list[str]:
        return list(UNET_ATTENTION_PROJECTIONS)

    def setup_training(self, rank: int, alpha: float, target_modules: list[str] | None) -> None:
        super().setup_training(rank, alpha, target_modules)
        # Trainable weights in float32 whatever the base dtype (updates of ~1e-4 relative size
        # would round away in bf16).
        self.trainable_in_float32()
        self.model_dtype = self.pipe.unet.dtype

    def export(self, directory: str | Path) -> Path:
        """LoRA: diffusers LoRA weights of the UNet (``pipe.load_lora_weights(directory)`` on
        the stock pipeline reproduces our samples). Full fine-tune: the UNet's
        ``save_pretrained`` in ``directory/unet``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if not self.is_lora:
            self.pipe.unet.save_pretrained(directory / "unet")
            return directory
        from peft.utils import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.network)
        prefix = "base_model.model."
        state = {k.removeprefix(prefix): v.detach().cpu().contiguous() for k, v in state.items()}
        config: Any = cast(Any, self.network).peft_config["default"]
        save = type(self.pipe).save_lora_weights
        kwargs: dict[str, Any] = {"unet_lora_layers": state}
        if "unet_lora_adapter_metadata" in inspect.signature(save).parameters:
            kwargs["unet_lora_adapter_metadata"] = _lora_metadata(config)
        elif config.lora_alpha != config.r:
            # Older diffusers load every adapter with alpha = r: fold alpha / r into B.
            scale = config.lora_alpha / config.r
            kwargs["unet_lora_layers"] = {
                k: v * scale if ".lora_B." in k else v for k, v in state.items()
            }
        save(str(directory), **kwargs)
        return directory


__all__ = ["UNET_ATTENTION_PROJECTIONS", "DiffusionUNetPolicy"]
