"""Flow-matching text-to-image models from diffusers as policies: the shared part.

One adapter per model family (``pipelines/sd3.py``, ``flux.py``, ``sana.py``) supplies prompt
encoding, the transformer call and latent packing; this base class does everything else the
same way for all of them:

* loads the stock pipeline with diffusers' own ``from_pretrained`` (hub id or local directory);
* encodes each distinct prompt once per batch and reuses the embedding across its group;
* classifier-free guidance in one batched forward with the unconditional branch detached
  (``FlowPolicy.velocity``);
* LoRA through peft on the attention projections (reference policy = adapter disabled, no second
  copy) or full fine-tuning, gradient checkpointing, low-precision frozen weights;
* the noise schedule of the pipeline's own scheduler, so that an ODE rollout reproduces
  ``pipe(...)``;
* export as diffusers LoRA weights (``pipe.load_lora_weights(dir)``) or ``save_pretrained``.
"""

from __future__ import annotations

import abc
import inspect
import warnings
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from torch import nn

from pipelines.base import Condition, FlowPolicy
from pipelines.loading import require_local_or_reachable

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


class FlowImagePolicy(FlowPolicy):
    """A diffusers flow-matching text-to-image pipeline as a policy.

    Args:
        pretrained: hub id or local directory of the pipeline (``save_pretrained`` layout).
        height, width: image size in pixels; None uses the model's native resolution.
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
        lora_init: peft's ``init_lora_weights`` (True: peft's default; ``"gaussian"``:
            Flow-GRPO's and DiffusionNFT's).
        pipeline: an already built pipeline instead of ``pretrained`` (tests, notebooks).
    """

    pipeline_class: ClassVar[str] = ""
    """Class name in ``diffusers`` this adapter drives (checked on load)."""

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
        pipeline: Any = None,
    ) -> None:
        super().__init__()
        self.detach_uncond = detach_uncond
        self.lora_init = lora_init
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.dtype = DTYPES[dtype]
        self.pipe = pipeline if pipeline is not None else self._load(pretrained, self.dtype)
        self._check_pipeline_class()
        self.negative_prompt = negative_prompt
        self.max_sequence_length = max_sequence_length or self._call_default(
            "max_sequence_length", 256
        )
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

    @abc.abstractmethod
    def _encode_negative(self) -> Condition:
        """The unconditional embedding, ``[1, ...]`` per key."""

    @abc.abstractmethod
    def _latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """One sample's latent shape for an image size (checking the size fits)."""

    @abc.abstractmethod
    def _decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Clean latents -> VAE output in ``[-1, 1]``."""

    def _scheduler_kwargs(self, num_steps: int) -> dict[str, Any]:
        """Extra ``set_timesteps`` arguments the pipeline passes (e.g. FLUX's ``mu``)."""
        del num_steps
        return {}

    # -- loading ---------------------------------------------------------------------------------
    @classmethod
    def _load(cls, pretrained: str | None, dtype: torch.dtype) -> Any:
        if not pretrained:
            raise ValueError(
                f"{cls.__name__} needs policy.pretrained: a hub id or a local directory of a "
                f"diffusers {cls.pipeline_class}"
            )
        import diffusers

        found = pipeline_class_name(pretrained)
        if found != cls.pipeline_class and found in FAMILIES:
            raise ValueError(
                f"{pretrained!r} holds a {found}, but {cls.__name__} drives a "
                f"{cls.pipeline_class} (policy.name=flow_image picks the family itself)"
            )
        pipeline_class = getattr(diffusers, cls.pipeline_class)
        try:
            with warnings.catch_warnings():
                # Newer diffusers rename torch_dtype to dtype; the old name works everywhere.
                warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
                return pipeline_class.from_pretrained(pretrained, torch_dtype=dtype)
        except (OSError, ValueError) as err:
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
            raise ValueError(
                f"cannot load {pretrained!r} as a {cls.pipeline_class}: {first_line}"
            ) from err

    def _check_pipeline_class(self) -> None:
        names = {c.__name__ for c in type(self.pipe).__mro__}
        if self.pipeline_class not in names:
            raise ValueError(
                f"{type(self).__name__} drives a {self.pipeline_class}, got a "
                f"{type(self.pipe).__name__} (use policy.name=flow_image to detect the family)"
            )

    def _call_default(self, name: str, fallback: Any) -> Any:
        """Default of a ``pipe(...)`` argument, so that our rollouts match a plain call."""
        parameter = inspect.signature(type(self.pipe).__call__).parameters.get(name)
        return fallback if parameter is None else parameter.default

    def _image_size(self, height: int | None, width: int | None) -> tuple[int, int]:
        # SD3/FLUX pipelines name their native latent size; SANA's is the transformer's.
        size = getattr(self.pipe, "default_sample_size", None)
        default = (size or self.pipe.transformer.config.sample_size) * self.pipe.vae_scale_factor
        return height or default, width or default

    def _components(self) -> dict[str, nn.Module]:
        """Every torch module of the pipeline (transformer, VAE, text encoders)."""
        return {
            name: module
            for name, module in self.pipe.components.items()
            if isinstance(module, nn.Module)
        }

    def _place(self) -> None:
        """Keep the frozen components on the transformer's device (the trainer moves only the
        trained network)."""
        device = self.device
        for name, module in self._components().items():
            if name != "transformer" and _module_device(module) != device:
                module.to(device)

    # -- FlowPolicy ------------------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Condition:
        """Each distinct prompt is encoded once; its rows are repeated for its group."""
        self._place()
        distinct = list(dict.fromkeys(prompts))
        index = torch.tensor([distinct.index(p) for p in prompts], device=self.device)
        encoded = self._encode(distinct)
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
        """Model time input for noise level ``sigma`` (diffusers schedulers use ``1000 s``)."""
        return sigma.float() * self.pipe.scheduler.config.num_train_timesteps

    def default_lora_targets(self) -> list[str]:
        return list(ATTENTION_PROJECTIONS)

    def setup_training(self, rank: int, alpha: float, target_modules: list[str] | None) -> None:
        super().setup_training(rank, alpha, target_modules)
        # Trainable weights in float32 whatever the base dtype: the optimizer's updates of
        # ~1e-4 relative size would round away in bf16.
        for parameter in self.trainable_parameters():
            parameter.data = parameter.data.float()
        self.model_dtype = self.pipe.transformer.dtype

    # -- export ----------------------------------------------------------------------------------
    def export(self, directory: str | Path) -> Path:
        """LoRA: diffusers LoRA weights (``pipe.load_lora_weights(directory)`` on the stock
        pipeline reproduces our samples). Full fine-tune: the transformer's ``save_pretrained``
        in ``directory/transformer`` (load it and pass ``transformer=`` to the pipeline)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if not self.is_lora:
            self.pipe.transformer.save_pretrained(directory / "transformer")
            return directory
        from peft.utils import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.network)
        prefix = "base_model.model."
        state = {k.removeprefix(prefix): v.detach().cpu().contiguous() for k, v in state.items()}
        config: Any = cast(Any, self.network).peft_config["default"]  # a peft LoraConfig
        kwargs: dict[str, Any] = {"transformer_lora_layers": state}
        save = type(self.pipe).save_lora_weights
        if "transformer_lora_adapter_metadata" in inspect.signature(save).parameters:
            # Keeps lora_alpha and the targets, so a loaded adapter has our scaling.
            kwargs["transformer_lora_adapter_metadata"] = _lora_metadata(config)
        elif config.lora_alpha != config.r:
            # Older diffusers load every adapter with alpha = r: fold our alpha / r into B.
            scale = config.lora_alpha / config.r
            state = {k: v * scale if ".lora_B." in k else v for k, v in state.items()}
            kwargs["transformer_lora_layers"] = state
        save(str(directory), **kwargs)
        return directory


def check_divisible(height: int, width: int, multiple: int, family: str = "this model") -> None:
    """Raise a clear error when the image size does not fit the latent grid."""
    if height % multiple or width % multiple:
        raise ValueError(
            f"height and width must be multiples of {multiple} for {family}, got {height}x{width}"
        )


def _module_device(module: nn.Module) -> torch.device:
    for parameter in module.parameters():
        return parameter.device
    return torch.device("cpu")


def _lora_metadata(config: Any) -> dict[str, Any]:
    targets = config.target_modules
    return {
        "r": config.r,
        "lora_alpha": config.lora_alpha,
        "target_modules": sorted(targets) if isinstance(targets, set | list) else targets,
        "lora_dropout": config.lora_dropout,
        "bias": config.bias,
        "use_dora": getattr(config, "use_dora", False),
    }


FAMILIES: dict[str, str] = {
    "StableDiffusion3Pipeline": "pipelines.sd3:SD3Policy",
    "FluxPipeline": "pipelines.flux:FluxPolicy",
    "SanaPipeline": "pipelines.sana:SanaPolicy",
    "WanPipeline": "pipelines.wan:WanPolicy",
}


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
    import importlib

    class_name = pipeline_class_name(pretrained)
    if class_name not in FAMILIES:
        raise ValueError(
            f"{pretrained!r} is a {class_name}; supported: {', '.join(FAMILIES)} "
            "(docs/porting_a_diffusers_model.md shows how to add one)"
        )
    module_name, cls_name = FAMILIES[class_name].split(":")
    cls: type[FlowImagePolicy] = getattr(importlib.import_module(module_name), cls_name)
    return cls
