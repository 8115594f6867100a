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
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipelines.base import disable_dropout
from pipelines.transformers_base import TransformersPolicy, load_model_and_tokenizer
from samplers.masked import MaskedDiffusionSampler, MaskedGeneration


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
            model, tokenizer = load_model_and_tokenizer(
                pretrained, dtype, trust_remote_code, _load_masked_lm, "masked LM"
            )
        if mask_token_id is None:
            mask_token_id = tokenizer.mask_token_id
        if mask_token_id is None:
            raise ValueError(
                "a masked-diffusion LM needs a mask token: the tokenizer names none, so set "
                "policy.kwargs.mask_token_id (LLaDA: 126336)"
            )
        self.tokenizer = tokenizer
        self.mask_token_id = int(mask_token_id)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.mask_token
        self.use_chat_template(chat_template)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        disable_dropout(model)
        self._takes_position_ids = "position_ids" in inspect.signature(model.forward).parameters
        self.network: nn.Module = model.requires_grad_(False)
        self.module = self.network
        # Where an answer ends: end-of-sequence ids of the generation config and tokenizer,
        # or BERT-style [SEP]; none means every completion position is part of the answer.
        from pipelines.causal_lm import eos_ids

        try:
            self.eos_token_ids = eos_ids(model, tokenizer)
        except ValueError:
            sep = getattr(tokenizer, "sep_token_id", None)
            self.eos_token_ids = [int(sep)] if sep is not None else []

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, P]`` left-padded prompt ids and attention mask."""
        tok = self.tokenizer
        tok.padding_side = "left"
        encoded = tok(
            self.format_prompts(prompts),
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,  # a chat template adds its own; plain prompts stay as is
        )
        return encoded["input_ids"].to(self.device), encoded["attention_mask"].to(self.device)

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
        sampler: MaskedDiffusionSampler,
        length: int,
        generator: torch.Generator | None = None,
    ) -> MaskedGeneration:
        ones = torch.ones(
            prompt_ids.shape[0], length, dtype=prompt_mask.dtype, device=prompt_mask.device
        )
        attention = torch.cat([prompt_mask, ones], dim=1)
        return sampler.generate(
            lambda ids: self.logits(ids, attention),
            prompt_ids,
            length,
            self.mask_token_id,
            generator,
        )

    def token_log_probs(
        self,
        inputs: torch.Tensor,
        attention_mask: torch.Tensor,
        targets: torch.Tensor,
        completion_start: int,
    ) -> torch.Tensor:
        """``[B, L]`` float32 ``log p(target_t | inputs)`` at every completion position (the
        estimator decides which positions count)."""
        logits = self.logits(inputs, attention_mask)[:, completion_start:]
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        return log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    def decode(self, tokens: torch.Tensor) -> list[str]:
        return self.tokenizer.batch_decode(tokens.cpu().tolist(), skip_special_tokens=True)

    def default_lora_targets(self) -> list[str]:
        names = {
            n.rsplit(".", 1)[-1]
            for n, m in self.network.named_modules()
            if isinstance(m, nn.Linear)
        }
        return sorted(names - {"decoder", "lm_head"})


def _load_masked_lm(pretrained: str, dtype: torch.dtype, trust_remote_code: bool) -> Any:
    from transformers import AutoModel, AutoModelForMaskedLM

    try:
        return AutoModelForMaskedLM.from_pretrained(
            pretrained, dtype=dtype, trust_remote_code=trust_remote_code
        )
    except ValueError:
        if not trust_remote_code:
            raise
        # LLaDA registers its model class for AutoModel only.
        return AutoModel.from_pretrained(pretrained, dtype=dtype, trust_remote_code=True)


EMBEDDED_SUDOKU_DLLM = Path(__file__).resolve().parents[1] / "genrl" / "assets" / "sudoku_dllm"


def sudoku_dllm(pretrained: str | None = None, **kwargs: Any) -> MaskedLMPolicy:
    """The embedded Sudoku masked-diffusion LM (``scripts/build_sudoku_dllm.py``), or another
    checkpoint given as ``pretrained``."""
    return MaskedLMPolicy(pretrained or str(EMBEDDED_SUDOKU_DLLM), **kwargs)
