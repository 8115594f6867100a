"""aMUSEd (``AmusedPipeline``) as a masked image-token policy (MaskGRPO on images).

Patil et al., "aMUSEd: An Open MUSE Reproduction" (2024): a VQ-GAN turns an image into a grid
of codebook indices, and a U-ViT (``UVit2DModel``) conditioned on CLIP-L/14's penultimate
hidden states and pooled projection predicts every masked index at once. Sampling starts from
an all-mask grid and reveals it in a few steps (``samplers/masked_image.py``: aMUSEd's own
MaskGIT scheduler, or MaskGRPO's emerge sampler).

The policy speaks the unmasking contract the masked-diffusion LMs speak
(``genrl.policies.protocols.MaskedImagePolicy``): a sample is ``[P]`` CLIP prompt ids followed
by ``L = (H/f)(W/f)`` image tokens in row-major order, ``token_log_probs`` scores image tokens
of a partially masked grid, ``generate`` runs a sampler. What is specific to aMUSEd:

* prompts encoded as the pipeline does (padded to the tokenizer's 77, hidden state ``[-2]``
  and ``text_embeds``), each distinct prompt once per call;
* classifier-free guidance with the pipeline's rule ``uncond + g (cond - uncond)`` (on when
  ``g > 1``), in one batched forward ``[uncond; cond]`` as ``pipe(...)`` runs it, so that a
  rollout with ``MaskGITSampler`` reproduces ``AmusedPipeline.__call__`` token for token;
* the micro-conditioning (size, crop, aesthetic score 6) of the pipeline's defaults;
* VQ decoding (``decode_images``, in ``[0, 1]``) and encoding (``encode_images``, the
  nearest codebook entry of each latent, as ``AmusedImg2ImgPipeline`` does);
* LoRA on the attention projections through peft (reference = adapter off), or full
  fine-tuning; export as a LoRA file that ``pipe.transformer.load_lora_adapter(dir,
  prefix=None, use_safetensors=True)`` loads into the stock pipeline, or the transformer's
  ``save_pretrained``.
"""

from __future__ import annotations

import inspect
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from loading.assets import embedded_asset_path
from pipelines.base import TrainablePolicy, disable_dropout
from pipelines.diffusers.checkpoint import load_pipeline
from pipelines.diffusers.flow_hooks import pipeline_modules, place_frozen
from samplers.masked import MaskedGeneration, UnmaskingSampler

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ATTENTION_PROJECTIONS = ["to_q", "to_k", "to_v", "to_out.0"]
LORA_FILE = "pytorch_lora_weights.safetensors"
TEXT_CACHE_ROWS = 512
"""Prompt encodings kept (least recently used dropped): an iteration's prompts fit."""


class AmusedPolicy(TrainablePolicy):
    """An ``AmusedPipeline`` checkpoint as a masked image-token policy.

    Args:
        pretrained: hub id or local directory of the pipeline (amused/amused-256, -512).
        height, width: image size in pixels; None: the transformer's ``sample_size`` times the
            VQ downsampling (256 or 512 for the released checkpoints).
        dtype: storage dtype of the frozen weights; trainable weights stay float32.
        gradient_checkpointing: recompute the U-ViT's activations in the backward pass.
        guidance_scale: classifier-free guidance of sampling (the pipeline's rule; > 1 turns it
            on); None: ``AmusedPipeline``'s default (10).
        negative_prompt: the unconditional prompt of guidance.
        guided_scoring: score log-probs under the guided logits the sampler draws from
            (True), or under the conditional model alone (False, MaskGRPO's released code,
            whose scoring forward has no guidance).
        aesthetic_score: the micro-conditioning aesthetic score (the pipeline's default 6).
        lora_init: peft's ``init_lora_weights``.
        pipeline: an already built ``AmusedPipeline`` instead of ``pretrained``.
    """

    pipeline_class = "AmusedPipeline"
    masks_prompts = False
    """CLIP has no mask token, so prompts are never masked (d1's prompt masking is off)."""

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        height: int | None = None,
        width: int | None = None,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        guidance_scale: float | None = None,
        negative_prompt: str = "",
        guided_scoring: bool = False,
        aesthetic_score: float = 6.0,
        lora_init: bool | str = True,
        pipeline: Any = None,
    ) -> None:
        super().__init__()
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.pipe = (
            pipeline
            if pipeline is not None
            else load_pipeline(self.pipeline_class, type(self).__name__, pretrained, DTYPES[dtype])
        )
        if type(self.pipe).__name__ != self.pipeline_class:
            raise ValueError(
                f"AmusedPolicy drives an AmusedPipeline, got {type(self.pipe).__name__}"
            )
        self.lora_init = lora_init
        defaults = inspect.signature(type(self.pipe).__call__).parameters
        self.guidance_scale = float(
            defaults["guidance_scale"].default if guidance_scale is None else guidance_scale
        )
        self.negative_prompt, self.guided_scoring = negative_prompt, guided_scoring
        transformer = self.pipe.transformer
        if gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        for component in self._components().values():
            component.requires_grad_(False).eval()
        # Old log-probs are scored in eval mode and the loss in train mode: no dropout, so that
        # the first update is on-policy.
        disable_dropout(transformer)
        self.network: nn.Module = transformer
        self.module = transformer
        self.tokenizer = self.pipe.tokenizer
        self.eos_token_ids: list[int] = []  # no end token: every image token is sampled
        self.mask_token_id = int(self.pipe.scheduler.config.mask_token_id)
        self.masking_schedule = str(self.pipe.scheduler.config.masking_schedule)
        factor = self.pipe.vae_scale_factor
        native = transformer.config.sample_size * factor
        self.height, self.width = height or native, width or native
        if self.height % factor or self.width % factor:
            raise ValueError(
                f"AmusedPolicy: height and width must be multiples of {factor} (the VQ "
                f"downsampling), got {self.height}x{self.width}"
            )
        self.grid = (self.height // factor, self.width // factor)
        self.num_image_tokens = self.grid[0] * self.grid[1]
        self.aesthetic_score = aesthetic_score
        self._null: tuple[torch.Tensor, torch.Tensor] | None = None
        self._text_cache: OrderedDict[Any, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    # -- components ------------------------------------------------------------------------------
    def _components(self) -> dict[str, nn.Module]:
        """Every torch module of the pipeline."""
        return pipeline_modules(self.pipe)

    def _place(self) -> None:
        """Keep the frozen components on the transformer's device (``place_frozen``)."""
        place_frozen(self.pipe, "transformer", self.device)

    # -- prompts ---------------------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, 77]`` CLIP ids padded to the tokenizer's length (as the pipeline pads) and an
        all-ones mask (the pipeline's text encoder reads every position)."""
        ids = self.tokenizer(
            [str(p) for p in prompts],
            return_tensors="pt",
            padding="max_length",
            truncation=True,
            max_length=self.tokenizer.model_max_length,
        ).input_ids.to(self.device)
        return ids, torch.ones_like(ids)

    @torch.no_grad()
    def _text(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(pooled ``[B, D]``, hidden ``[B, 77, E]``) of CLIP ids. Each distinct row is encoded
        once and kept (the text encoder is frozen): a group's samples and an objective's views
        share their prompt, and a prompt's embedding is then bit-identical in the rollout, the
        old log-probs and every training minibatch, whatever else shares their batch (a batch
        of another composition could round differently and the first ratio would not be 1)."""
        self._place()
        keys = [(str(ids.device), tuple(row)) for row in ids.tolist()]
        missing = list(dict.fromkeys(k for k in keys if k not in self._text_cache))
        if missing:
            rows = torch.tensor([k[1] for k in missing], device=ids.device)
            out = self.pipe.text_encoder(rows, return_dict=True, output_hidden_states=True)
            for i, key in enumerate(missing):
                self._text_cache[key] = (out.text_embeds[i], out.hidden_states[-2][i])
        for key in keys:
            self._text_cache.move_to_end(key)
        while len(self._text_cache) > TEXT_CACHE_ROWS:
            self._text_cache.popitem(last=False)
        pooled = torch.stack([self._text_cache[k][0] for k in keys])
        return pooled, torch.stack([self._text_cache[k][1] for k in keys])

    def _null_text(self) -> tuple[torch.Tensor, torch.Tensor]:
        null = self._null
        if null is None or null[0].device != self.device:
            ids, _ = self.encode_prompts([self.negative_prompt])
            null = self._null = self._text(ids)
        return null

    # -- the model -------------------------------------------------------------------------------
    def micro_conditions(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """``[n, 5]``: width, height, crop top, crop left, aesthetic score (the pipeline's order,
        width first)."""
        values = [self.width, self.height, 0, 0, self.aesthetic_score]
        return torch.tensor(values, device=self.device, dtype=dtype).unsqueeze(0).expand(n, -1)

    def image_logits(
        self, tokens: torch.Tensor, text: tuple[torch.Tensor, torch.Tensor], guided: bool
    ) -> torch.Tensor:
        """``[B, L, K]`` float32 codebook logits of the active (or reference) model for image
        tokens ``[B, L]``; with ``guided`` (and ``guidance_scale > 1``) the pipeline's CFG, in
        one forward over ``[uncond; cond]`` whose unconditional half carries no gradient."""
        pooled, hidden = text
        n = tokens.shape[0]
        grids = tokens.reshape(n, *self.grid)
        guide = guided and self.guidance_scale > 1.0
        if guide:
            null_pooled, null_hidden = self._null_text()
            pooled = torch.cat([null_pooled.expand(n, -1), pooled])
            hidden = torch.cat([null_hidden.expand(n, -1, -1), hidden])
            grids = torch.cat([grids, grids])
        dtype = self.pipe.transformer.dtype
        out = self._active_module()(
            grids,
            micro_conds=self.micro_conditions(grids.shape[0], hidden.dtype),
            pooled_text_emb=pooled.to(dtype),
            encoder_hidden_states=hidden.to(dtype),
        )
        logits = out.float().flatten(2).transpose(1, 2)  # [B, K, h, w] -> [B, h*w, K]
        if not guide:
            return logits
        uncond, cond = logits.chunk(2)
        uncond = uncond.detach()
        return uncond + self.guidance_scale * (cond - uncond)

    def token_log_probs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        targets: torch.Tensor,
        temperature: float = 1.0,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[B, L]`` ``log p(targets | input)`` of the image tokens: ``input_ids`` are the CLIP
        prompt ids followed by the (partially masked) ``L`` image tokens."""
        del attention_mask, model_inputs  # CLIP reads the whole padded prompt
        length = targets.shape[1]
        text = self._text(input_ids[:, :-length])
        logits = self.image_logits(input_ids[:, -length:], text, self.guided_scoring)
        if temperature != 1.0:
            logits = logits / temperature
        log_probs = logits.log_softmax(dim=-1)
        return log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        sampler: UnmaskingSampler,
        max_new_tokens: int,
        generator: torch.Generator | None = None,
    ) -> MaskedGeneration:
        """``[B, L]`` image tokens revealed by ``sampler`` under guided logits."""
        del prompt_mask
        if max_new_tokens != self.num_image_tokens:
            raise ValueError(
                f"generation.max_new_tokens must be {self.num_image_tokens} for "
                f"{self.height}x{self.width} images ({self.grid[0]}x{self.grid[1]} tokens), "
                f"got {max_new_tokens}"
            )
        text = self._text(prompt_ids)
        length = self.num_image_tokens

        def logits_fn(ids: torch.Tensor) -> torch.Tensor:
            return self.image_logits(ids[:, -length:], text, guided=True)

        return sampler.generate(logits_fn, prompt_ids, length, self.mask_token_id, generator)

    # -- the VQ model ----------------------------------------------------------------------------
    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """Image tokens ``[B, L]`` -> images ``[B, 3, H, W]`` in ``[0, 1]`` (the pipeline's
        ``vqvae.decode(..., force_not_quantize=True)``, clipped)."""
        self._place()
        vq = self.pipe.vqvae
        shape = (tokens.shape[0], *self.grid, vq.config.latent_channels)
        decoded = vq.decode(tokens.to(vq.device), force_not_quantize=True, shape=shape).sample
        return decoded.float().clip(0, 1)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images ``[B, 3, H, W]`` in ``[0, 1]`` -> ``[B, L]`` codebook indices (the nearest
        entry of each encoded latent, as ``AmusedImg2ImgPipeline`` encodes)."""
        self._place()
        vq = self.pipe.vqvae
        latents = vq.encode(images.to(vq.device, vq.dtype)).latents
        indices = vq.quantize(latents)[2][2]
        return indices.reshape(images.shape[0], -1)

    # -- training --------------------------------------------------------------------------------
    def default_lora_targets(self) -> list[str]:
        return list(ATTENTION_PROJECTIONS)

    def setup_training(self, rank: int, alpha: float, target_modules: list[str] | None) -> None:
        super().setup_training(rank, alpha, target_modules)
        # float32 trainable weights whatever the storage dtype (updates would round away in bf16)
        self.trainable_in_float32()

    def export(self, directory: str | Path) -> Path:
        """LoRA: ``pytorch_lora_weights.safetensors`` with peft's adapter config as metadata,
        loaded by ``pipe.transformer.load_lora_adapter(directory, prefix=None,
        use_safetensors=True)`` (aMUSEd's pipeline has no ``load_lora_weights``). Full fine-tune: ``directory/transformer``
        (``UVit2DModel.from_pretrained`` and ``AmusedPipeline.from_pretrained(...,
        transformer=...)``)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if not self.is_lora:
            self.pipe.transformer.save_pretrained(directory / "transformer")
            return directory
        from diffusers.loaders.lora_base import LORA_ADAPTER_METADATA_KEY
        from peft.utils import get_peft_model_state_dict
        from safetensors.torch import save_file

        state = get_peft_model_state_dict(self.network)
        prefix = "base_model.model."
        state = {k.removeprefix(prefix): v.detach().cpu().contiguous() for k, v in state.items()}
        config = cast(Any, self.network).peft_config["default"].to_dict()
        config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
        metadata = {"format": "pt", LORA_ADAPTER_METADATA_KEY: json.dumps(config, sort_keys=True)}
        save_file(state, str(directory / LORA_FILE), metadata=metadata)
        return directory


EMBEDDED_COMPOSITIONAL_DISCRETE = "compositional_discrete"
"""The compositional task's aMUSEd pipeline (``scripts/build_discrete_assets.py``)."""


def compositional_discrete(pretrained: str | None = None, **kwargs: Any) -> AmusedPolicy:
    """The embedded 32x32 aMUSEd pipeline of the compositional task, or another checkpoint
    given as ``pretrained``."""
    path = pretrained or str(embedded_asset_path(EMBEDDED_COMPOSITIONAL_DISCRETE))
    if pretrained is None and not Path(path, "model_index.json").is_file():
        raise FileNotFoundError(
            f"embedded aMUSEd pipeline not found at {path}; rebuild it with "
            "`python scripts/build_discrete_assets.py`"
        )
    return AmusedPolicy(path, **kwargs)


# It takes what AmusedPolicy takes (genrl checks a config's keywords against this signature).
setattr(compositional_discrete, "__signature__", inspect.signature(AmusedPolicy))  # noqa: B010

__all__ = ["AmusedPolicy", "compositional_discrete"]
