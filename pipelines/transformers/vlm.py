"""Vision-language models (transformers ``AutoModelForImageTextToText`` + ``AutoProcessor``) as
causal token policies: the GRPO family trains them exactly as it trains text LMs.

A prompt's images come from its dataset row (``Prompt.columns["images"]``: paths or PIL
images). Each distinct prompt goes through the checkpoint's processor once per batch, as one
user message ``[image, ..., text]`` in the processor's chat template (or, without one, its
image token per image, then the text), left-padded; the image
placeholders expand to the number of vision tokens the processor computes. The pixels travel
with the rollout as batch-first ``model_inputs`` (``TokenRollout.model_inputs``), so minibatches
slice them like any other per-sample tensor:

* processors that return ``image_grid_thw`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) flatten every
  image's patches into one ``[patches, D]`` tensor; they are packed per sample as
  ``pixel_values [B, max_patches, D]`` and ``image_grid_thw [B, max_images, 3]`` (zero rows are
  padding) and flattened back before each forward;
* processors that return pixel rows per image (LLaVA, LLaVA-NeXT, Gemma 3, PaliGemma) are
  nested per prompt, ``[B, max_images, ...]`` with ``images_per_prompt``, and concatenated back
  before each forward; which layout a processor has is asked once (``_one_row_per_image``);
* the others already return batch-first pixels, every prompt's images nested as
  ``[B, images, C, H, W]``, zero-padded to the prompt with the most, with a
  ``pixel_attention_mask`` (Idefics3 and SmolVLM, with image splitting); a processor output
  that is not one row per prompt is refused with an error naming it.

Token types are rebuilt from the ids (a completion is text, whatever ids a policy samples),
as the family table says (``vlm_families.py``): ``mm_token_type_ids`` for models whose forward
takes them (Qwen), ``token_type_ids`` marking image tokens for Gemma 3 (bidirectional among
them), and PaliGemma's prefix (image and prompt, bidirectional) and suffix (the completion).

Qwen-family models place tokens with multimodal RoPE (three position streams, vision tokens on
a grid); their position ids come from the model's own ``get_rope_index`` in sampling and in
scoring, so the two agree. Other models count real tokens, as ``CausalLMPolicy`` does.

LoRA goes on the language model's projections; the vision tower and projector stay frozen
unless ``train_vision`` (then their linear layers get LoRA too). ``export`` writes a peft
adapter (``PeftModel.from_pretrained(AutoModelForImageTextToText..., dir)``) or
``save_pretrained`` weights, with the processor.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from loading.assets import embedded_asset_path
from loading.transformers_checkpoint import load_vision_language_model
from pipelines.transformers.base import (
    POLICY_HINTS,
    StopStrings,
    TransformersPolicy,
    eos_ids,
    policy_checkpoint,
)
from pipelines.transformers.vlm_families import vlm_family
from pipelines.transformers.vlm_inputs import open_image, pack_pixels, unpack_pixels
from samplers.autoregressive import Generation, TokenSampler, generate
from tasks.prompt import prompt_columns, prompt_id

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Module-name parts of the vision side (frozen by default): Qwen's ``visual``, LLaVA's and
# Gemma's ``vision_tower`` and ``multi_modal_projector``, Idefics3's ``vision_model`` and
# ``connector``.
VISION_PARTS = ("visual", "vision_tower", "vision_model", "multi_modal_projector", "connector")


class VLMPolicy(TransformersPolicy, StopStrings):
    """A vision-language model as a causal token policy.

    Args:
        pretrained: hub id or local directory with the model and its processor.
        dtype: storage dtype of the frozen weights; trainable weights stay float32.
        gradient_checkpointing: recompute activations in the backward pass.
        image_column: the prompt column holding each prompt's image paths (or PIL images).
        train_vision: also put LoRA on (or, without LoRA, train) the vision tower and projector.
        trust_remote_code: allow the checkpoint's own modelling code (off by default).
        model, processor: already built objects instead of ``pretrained`` (tests, notebooks).
    """

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        image_column: str = "images",
        train_vision: bool = False,
        trust_remote_code: bool = False,
        model: Any = None,
        processor: Any = None,
    ) -> None:
        super().__init__()
        if model is None or processor is None:
            model, processor = load_vision_language_model(
                policy_checkpoint(pretrained, "vlm"), dtype, trust_remote_code, POLICY_HINTS
            )
        self.processor = processor
        self._chat = bool(getattr(processor, "chat_template", None))
        if not self._chat and not getattr(processor, "image_token", None):
            raise ValueError(
                "the VLM's processor has neither a chat template nor an image token: genrl "
                "cannot place the images in a prompt"
            )
        tokenizer = processor.tokenizer
        self._adopt(
            model,
            tokenizer,
            chat_template=False,  # the processor's template is applied in _process
            gradient_checkpointing=gradient_checkpointing,
            pad_fallback=tokenizer.eos_token,
        )
        # The transformers model itself (a given peft model unwrapped); peft wraps in place.
        unwrap = getattr(model, "get_base_model", None)
        self.base_model = unwrap() if unwrap is not None else model
        self.image_column = image_column
        self.train_vision = train_vision
        self.eos_token_ids = eos_ids(model, tokenizer)
        inner = getattr(self.base_model, "model", None)
        self._rope_index = getattr(inner, "get_rope_index", None)
        parameters = inspect.signature(self.base_model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        # The token types its forward takes differ by family (vlm_families.py).
        model_type = getattr(self.base_model.config, "model_type", "")
        self.family = vlm_family(model_type, set(parameters))
        # Only the positions that score the completion need logits (not the vision tokens').
        self._logits_to_keep = "logits_to_keep" in parameters
        # A completion is text: the model never samples (and is never scored on) the vision
        # placeholders, which the model's forward would take for image positions.
        config = self.base_model.config
        names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
        special = {int(i) for n in names if (i := getattr(config, n, None)) is not None}
        self._placeholders = sorted(special - set(self.eos_token_ids))
        self._last: tuple[list[str], torch.device, Any] | None = None
        self._per_image: bool | None = None  # the processor's pixel layout, once asked

    # -- prompts ------------------------------------------------------------------------------------
    def format_prompts(self, prompts: list[str]) -> list[str]:
        """Each prompt as one user message: its images, then its text. A processor without a
        chat template (PaliGemma's: the model reads no turns) gets its image token once per
        image, then the text; it expands the tokens and adds its own separators."""
        return [self._format(str(p), len(self._images(p))) for p in prompts]

    def _format(self, text: str, images: int) -> str:
        if not self._chat:
            return self.processor.image_token * images + text
        content = [*({"type": "image"} for _ in range(images)), {"type": "text", "text": text}]
        return self.processor.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )

    def _one_row_per_image(self, image: Any) -> bool:
        """Whether the processor returns pixel rows per image (LLaVA, LLaVA-NeXT, Gemma 3,
        PaliGemma) rather than per prompt (Idefics3, SmolVLM): the two agree on one-image
        prompts, so it is asked once, with a prompt holding ``image`` twice. A processor that
        refuses two images counts as per prompt (batches of uneven counts are then refused)."""
        if self._per_image is None:
            try:
                text = [self._format("?", 2)]
                out = self.processor(
                    text=text, images=[[image, image]], return_tensors="pt", **self._special(text)
                )
                self._per_image = len(out["pixel_values"]) == 2 and len(out["input_ids"]) == 1
            except Exception:  # any refusal: not known to be a per-image processor
                self._per_image = False
        return self._per_image

    def _special(self, texts: list[str]) -> dict[str, bool]:
        """No special tokens from the tokenizer when the template wrote the begin token itself
        (Gemma 3's starts with ``<bos>``, and its tokenizer adds one): the rule of the
        processor's own ``apply_chat_template(tokenize=True)``, so the prompt is the one the
        stock chat path gives."""
        bos = self.tokenizer.bos_token
        return {"add_special_tokens": False} if bos and texts[0].startswith(bos) else {}

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, P]`` left-padded ids (image placeholders expanded) and attention mask."""
        ids, mask, _ = self._process(prompts)
        return ids, mask

    def model_inputs(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """The prompts' pixels, packed batch-first (module docstring)."""
        return self._process(prompts)[2]

    def _images(self, prompt: str) -> list[Any]:
        columns = prompt_columns(prompt)
        value = columns.get(self.image_column)
        if value is None and self.image_column == "images":
            value = columns.get("image", [])  # the singular spelling datasets also use
        value = [] if value is None else value
        return list(value) if isinstance(value, list | tuple) else [value]

    def _process(
        self, prompts: list[str]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        # encode_prompts and model_inputs are called back to back on the same prompts.
        device = self.device
        ids = [prompt_id(p) for p in prompts]  # rows may share a text, not their images
        if self._last is not None and self._last[:2] == (ids, device):
            return cast(Any, self._last[2])
        first = {i: p for i, p in zip(ids, prompts, strict=True)}  # distinct, in order
        distinct = list(first.values())
        images = [[open_image(i) for i in self._images(p)] for p in distinct]
        tokenizer = self.tokenizer
        tokenizer.padding_side = "left"
        texts = self.format_prompts(distinct)
        out = self.processor(
            text=texts,
            images=images if any(images) else None,
            return_tensors="pt",
            padding=True,
            **self._special(texts),
        )
        per_image = any(images) and "image_grid_thw" not in out
        per_image = per_image and self._one_row_per_image(next(i for i in images if i)[0])
        packed = pack_pixels(out, [len(i) for i in images], distinct, per_image)
        row = {i: r for r, i in enumerate(first)}
        index = torch.tensor([row[i] for i in ids])
        result = (
            out["input_ids"][index].to(device),
            out["attention_mask"][index].to(device),
            {k: v[index].to(device) for k, v in packed.items()},
        )
        self._last = (ids, device, result)
        return result

    # -- the model call -----------------------------------------------------------------------------
    def _model_kwargs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        model_inputs: dict[str, torch.Tensor] | None,
        completion_length: int = 0,
    ) -> dict[str, Any]:
        """Pixels unpacked, token types rebuilt from the prompt's ids (a completion is text,
        whatever ids a policy samples), and position ids (multimodal RoPE from the model's own
        ``get_rope_index``, or real-token counts)."""
        kwargs = unpack_pixels(model_inputs or {}, self.model_dtype)
        types = self.family.token_types
        if types is not None:
            kwargs[types.argument] = types.of(input_ids, self.base_model.config, completion_length)
        if self._rope_index is not None:
            positions, deltas = self._rope_index(
                input_ids,
                mm_token_type_ids=kwargs.get("mm_token_type_ids"),
                image_grid_thw=kwargs.get("image_grid_thw"),
                attention_mask=attention_mask,
            )
            kwargs["position_ids"], kwargs["rope_deltas_"] = positions, deltas
        else:
            kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return kwargs

    @property
    def model_dtype(self) -> torch.dtype:
        return next(p.dtype for p in self.base_model.parameters() if p.is_floating_point())

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        sampler: TokenSampler,
        max_new_tokens: int,
        generator: torch.Generator | None = None,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> Generation:
        module = self._active_module()
        first = self._model_kwargs(prompt_ids, prompt_mask, model_inputs)
        deltas = first.pop("rope_deltas_", None)

        def next_logits(ids, positions, attention, cache):
            if cache is None:  # the prompt: pixels and the model's own positions
                kwargs = {**first, **({"logits_to_keep": 1} if self._logits_to_keep else {})}
            elif deltas is not None:  # later tokens continue the text stream past the images
                kwargs = {"position_ids": (positions + deltas).unsqueeze(0).expand(3, -1, -1)}
            else:
                kwargs = {"position_ids": positions}
            out = module(
                input_ids=ids,
                attention_mask=attention,
                use_cache=True,
                **{self._cache_argument: cache},
                **kwargs,
            )
            return self._text_only(out.logits[:, -1]), getattr(out, self._cache_argument)

        return generate(
            next_logits,
            prompt_ids,
            prompt_mask,
            sampler,
            max_new_tokens,
            self.eos_token_ids,
            int(self.tokenizer.pad_token_id),
            generator,
        )

    def completion_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        length: int,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[B, length, V]``: position ``t - 1`` predicts token ``t``, with the prompts'
        pixels and the positions sampling used."""
        kwargs = self._model_kwargs(input_ids, attention_mask, model_inputs, length)
        kwargs.pop("rope_deltas_", None)
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = length + 1
        logits = self._active_module()(
            input_ids=input_ids, attention_mask=attention_mask, **kwargs
        ).logits
        return self._text_only(logits[:, -(length + 1) : -1])

    def _text_only(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with the vision placeholders' entries at ``-inf``."""
        if not self._placeholders:
            return logits
        logits = logits.clone()
        logits[..., self._placeholders] = float("-inf")
        return logits

    # -- training setup and export ------------------------------------------------------------------
    def default_lora_targets(self) -> list[str]:
        """Full module names: the language model's projections (and the vision side's linear
        layers with ``train_vision``), so a vision tower that shares names stays frozen."""
        names = []
        for name, module in self.network.named_modules():
            if not isinstance(module, nn.Linear) or name.endswith("lm_head"):
                continue
            vision = _is_vision(name)
            language = not vision and name.rsplit(".", 1)[-1] in LORA_TARGETS
            if language or (vision and self.train_vision):
                names.append(name)
        return names

    def setup_training(self, rank: int, alpha: float, target_modules: list[str] | None) -> None:
        if target_modules:  # the names the user gave, kept off the vision side by default
            given = target_modules
            target_modules = [
                name
                for name, module in self.network.named_modules()
                if isinstance(module, nn.Linear)
                and any(name == t or name.endswith("." + t) for t in given)
                and (self.train_vision or not _is_vision(name))
            ]
            if not target_modules:
                raise ValueError(
                    f"policy.lora_target_modules {given} match no linear layer of the language "
                    "model (set policy.kwargs.train_vision=true to train the vision tower)"
                )
        storage = self.model_dtype
        if rank == 0 and not self.train_vision:
            # Full fine-tuning of the language side only; the vision side stays frozen and in
            # its storage dtype (the base class makes trained weights float32).
            super().setup_training(rank, alpha, target_modules)
            for name, parameter in self.network.named_parameters():
                if _is_vision(name):
                    parameter.requires_grad_(False)
                    parameter.data = parameter.data.to(storage)
            return
        super().setup_training(rank, alpha, target_modules)

    def export(self, directory: str | Path) -> Path:
        """A peft adapter or ``save_pretrained`` weights, with the processor."""
        directory = super().export(directory)
        self.processor.save_pretrained(str(directory))
        return directory


EMBEDDED_SHAPES_VLM = embedded_asset_path("shapes_vlm")


def shapes_vlm(pretrained: str | None = None, **kwargs: Any) -> VLMPolicy:
    """The embedded tiny Qwen2-VL for the shapes VQA task (``scripts/build_vqa_vlm.py``), or
    another checkpoint given as ``pretrained``."""
    return VLMPolicy(pretrained or str(EMBEDDED_SHAPES_VLM), **kwargs)


# It takes what VLMPolicy takes (genrl checks a config's keywords against this signature).
setattr(shapes_vlm, "__signature__", inspect.signature(VLMPolicy))  # noqa: B010


def _is_vision(name: str) -> bool:
    return any(part in name.split(".") for part in VISION_PARTS)
