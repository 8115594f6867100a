"""Masked-diffusion language models (LLaDA-style) as token policies.

A bidirectional transformer that predicts masked tokens: transformers ``AutoModelForMaskedLM``
checkpoints natively (ModernBERT, BERT, the embedded Sudoku model), custom ones such as LLaDA
through ``trust_remote_code`` when the user turns it on. Completions have a fixed length and are
revealed by ``samplers/masked.py``; likelihoods come from the pluggable estimators of
``genrl/objectives/dllm_estimators.py``, which call ``token_log_probs`` on partially masked inputs.

Layout of a batch: prompts left-padded to ``P`` tokens, then ``L`` completion tokens.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from loading.assets import embedded_asset_path
from loading.transformers_checkpoint import load_masked_lm
from pipelines.transformers.base import (
    POLICY_HINTS,
    TransformersPolicy,
    eos_ids,
    policy_checkpoint,
)
from samplers.masked import MaskedGeneration, UnmaskingSampler


class MaskedLMPolicy(TransformersPolicy):
    """A masked-diffusion LM as a policy.

    Args:
        pretrained: hub id or local directory with the model and its tokenizer.
        dtype: storage dtype of the frozen weights; trainable weights stay float32.
        gradient_checkpointing: recompute activations in the backward pass.
        trust_remote_code: allow the checkpoint's own modelling code (LLaDA needs it; off by
            default).
        chat_template: wrap each prompt as a user message with the tokenizer's chat template
            (instruction-tuned checkpoints such as LLaDA-8B-Instruct).
        mask_token_id: the mask token when the tokenizer does not name one (LLaDA: 126336).
        model, tokenizer: already built objects instead of ``pretrained``.
    """

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        trust_remote_code: bool = False,
        chat_template: bool = False,
        mask_token_id: int | None = None,
        model: Any = None,
        tokenizer: Any = None,
    ) -> None:
        super().__init__()
        if model is None or tokenizer is None:
            checkpoint = policy_checkpoint(pretrained, "masked LM")
            model, tokenizer = load_masked_lm(checkpoint, dtype, trust_remote_code, POLICY_HINTS)
        if mask_token_id is None:
            mask_token_id = tokenizer.mask_token_id
        if mask_token_id is None:
            raise ValueError(
                "a masked-diffusion LM needs a mask token: the tokenizer names none, so set "
                "policy.kwargs.mask_token_id (LLaDA: 126336)"
            )
        self.mask_token_id = int(mask_token_id)
        self.masks_prompts = True  # prompt and completion share the vocabulary and its mask
        self._adopt(
            model,
            tokenizer,
            chat_template=chat_template,
            gradient_checkpointing=gradient_checkpointing,
            pad_fallback=tokenizer.eos_token or tokenizer.mask_token,
        )
        self._takes_position_ids = "position_ids" in inspect.signature(model.forward).parameters
        # Where an answer ends: end-of-sequence ids of the generation config and tokenizer,
        # or BERT-style [SEP]; none means every completion position is part of the answer.
        try:
            self.eos_token_ids = eos_ids(model, tokenizer)
        except ValueError:
            sep = getattr(tokenizer, "sep_token_id", None)
            self.eos_token_ids = [int(sep)] if sep is not None else []

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, P]`` left-padded prompt ids and attention mask; a chat template adds its own
        special tokens, plain prompts stay as they are."""
        return self._encode(prompts, add_special_tokens=False)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, P + L, V]`` logits of the active (or reference) model. Positions count real
        tokens only, so that left padding (prompts of different lengths, batches concatenated by
        dynamic sampling) does not move a model with absolute position embeddings (BERT)."""
        kwargs = {}
        if self._takes_position_ids:
            kwargs["position_ids"] = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
        out = self._active_module()(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out.logits

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        sampler: UnmaskingSampler,
        max_new_tokens: int,
        generator: torch.Generator | None = None,
    ) -> MaskedGeneration:
        """A completion of exactly ``max_new_tokens`` tokens per prompt, revealed by ``sampler``."""
        ones = torch.ones(
            prompt_ids.shape[0], max_new_tokens, dtype=prompt_mask.dtype, device=prompt_mask.device
        )
        attention = torch.cat([prompt_mask, ones], dim=1)
        return sampler.generate(
            lambda ids: self.logits(ids, attention),
            prompt_ids,
            max_new_tokens,
            self.mask_token_id,
            generator,
        )

    def completion_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        length: int,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[B, length, V]``: a masked LM predicts every position from the whole input."""
        del model_inputs  # text only
        return self.logits(input_ids, attention_mask)[:, -length:]

    def default_lora_targets(self) -> list[str]:
        return sorted(self.linear_layer_names() - {"decoder", "lm_head"})


EMBEDDED_SUDOKU_DLLM = embedded_asset_path("sudoku_dllm")


def sudoku_dllm(pretrained: str | None = None, **kwargs: Any) -> MaskedLMPolicy:
    """The embedded Sudoku masked-diffusion LM (``scripts/build_sudoku_dllm.py``), or another
    checkpoint given as ``pretrained``."""
    return MaskedLMPolicy(pretrained or str(EMBEDDED_SUDOKU_DLLM), **kwargs)


# It takes what MaskedLMPolicy takes (genrl checks a config's keywords against this signature).
setattr(sudoku_dllm, "__signature__", inspect.signature(MaskedLMPolicy))  # noqa: B010
