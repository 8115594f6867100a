"""What the token policies built on transformers checkpoints share: how their settings are
named in loading errors (``loading/transformers_checkpoint.py`` loads), one batch layout
(prompts left-padded to ``P`` tokens, then the completion), tokenizing and decoding, scoring
``log p(target | input)`` through ``selected_log_probs``, and saving in the ecosystem's format
(a peft adapter or ``save_pretrained``, with the tokenizer).

Each adapter supplies the model-specific step: which logits score the completion
(``completion_logits``), how it samples (``generate``), and its end tokens."""

from __future__ import annotations

import abc
from collections.abc import Callable
from itertools import compress
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from loading.transformers_checkpoint import CheckpointHints
from pipelines.base import TrainablePolicy, disable_dropout
from samplers.autoregressive import selected_log_probs, selected_log_probs_and_entropies

# How a policy's settings are spelled in the checkpoint loader's errors.
POLICY_HINTS = CheckpointHints(
    local_dir="--set policy.pretrained=DIR (a directory written by save_pretrained)",
    trust_remote_code="policy.kwargs.trust_remote_code=true",
)


def policy_checkpoint(pretrained: str | None, kind: str) -> str:
    """``pretrained``, which a policy built without ``model`` and tokenizer must name."""
    if not pretrained:
        raise ValueError(f"policy {kind} needs policy.pretrained: a hub id or a local directory")
    return pretrained


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """End ids from the generation config (may list several, e.g. chat models) and tokenizer."""
    ids: set[int] = set()
    generation = getattr(model, "generation_config", None)
    configured = getattr(generation, "eos_token_id", None) if generation is not None else None
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("the tokenizer and generation config define no end-of-sequence token")
    return sorted(ids)


class TransformersPolicy(TrainablePolicy, abc.ABC):
    """Base of ``CausalLMPolicy`` and ``MaskedLMPolicy``: float32 trainable weights whatever
    the storage dtype, and export with the tokenizer.

    Attributes:
        tokenizer: the checkpoint's tokenizer.
        eos_token_ids: ids that end an answer (empty: every completion position belongs to it).
    """

    tokenizer: Any
    chat_template: bool = False
    eos_token_ids: list[int]

    def _adopt(
        self,
        model: Any,
        tokenizer: Any,
        *,
        chat_template: bool,
        gradient_checkpointing: bool,
        pad_fallback: str | None,
    ) -> None:
        """Take ``model`` and ``tokenizer`` as this policy's: a pad token (``pad_fallback`` when
        the tokenizer has none; batched prompts need one), the chat template, gradient
        checkpointing, dropout off, weights frozen until ``setup_training``."""
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = pad_fallback
        self.use_chat_template(chat_template)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        disable_dropout(model)
        self.network = model.requires_grad_(False)
        self.module = self.network

    # -- prompts and text -------------------------------------------------------------------------
    def _encode(
        self, prompts: list[str], *, add_special_tokens: bool, max_length: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, P]`` left-padded prompt ids and attention mask (on the model's device), the
        last ``max_length`` tokens of each when set.

        Each distinct prompt is formatted and tokenized once and its row repeated: a rollout
        batch holds every prompt ``group_size`` times, and the padded width (the longest
        prompt's) is the same either way."""
        tok = self.tokenizer
        tok.padding_side, tok.truncation_side = "left", "left"
        distinct = list(dict.fromkeys(prompts))
        encoded = tok(
            self.format_prompts(distinct),
            return_tensors="pt",
            padding=True,
            truncation=max_length is not None,
            max_length=max_length,
            add_special_tokens=add_special_tokens,
        )
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        if len(distinct) < len(prompts):
            row = {prompt: i for i, prompt in enumerate(distinct)}
            index = torch.tensor([row[prompt] for prompt in prompts])
            ids, mask = ids[index], mask[index]
        return ids.to(self.device), mask.to(self.device)

    def decode(self, tokens: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """Completion texts (special tokens dropped) of ``tokens [B, T]`` where ``mask``."""
        # Select on Python lists: indexing the tensor row by row costs ~10 us a row.
        rows = [
            list(compress(ids, keep))
            for ids, keep in zip(tokens.tolist(), mask.tolist(), strict=True)
        ]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    # -- scoring -----------------------------------------------------------------------------------
    def model_inputs(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """Text models read nothing besides the token ids."""
        del prompts
        return {}

    @abc.abstractmethod
    def completion_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        length: int,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[B, length, V]`` logits of the active (or reference) model that score the last
        ``length`` positions of ``input_ids [B, P + length]``."""

    def token_log_probs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        targets: torch.Tensor,
        temperature: float = 1.0,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[B, T]`` float32 ``log p(targets_t | input_ids)`` at temperature ``temperature``
        (0 scores at 1) for the completion, the last ``T`` columns of ``input_ids``. A causal LM
        reads its own completion (``targets`` = those columns); a masked-diffusion LM reads a
        corrupted one (``targets`` = the sampled tokens); ``model_inputs`` are the prompts'
        other inputs (``model_inputs(prompts)`` of the same rows)."""
        logits = self.completion_logits(input_ids, attention_mask, targets.shape[1], model_inputs)
        return selected_log_probs(logits, targets, temperature)

    def token_log_probs_and_entropies(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        targets: torch.Tensor,
        temperature: float = 1.0,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``token_log_probs`` and the entropy of every scored position's distribution at
        ``temperature``, both ``[B, T]`` float32, from one forward."""
        logits = self.completion_logits(input_ids, attention_mask, targets.shape[1], model_inputs)
        return selected_log_probs_and_entropies(logits, targets, temperature)

    def linear_layer_names(self) -> set[str]:
        """Last name components of the network's ``nn.Linear`` modules (LoRA targets)."""
        return {
            n.rsplit(".", 1)[-1]
            for n, m in self.network.named_modules()
            if isinstance(m, nn.Linear)
        }

    def use_chat_template(self, enabled: bool) -> None:
        """Wrap each prompt as a user message with the tokenizer's chat template."""
        if enabled and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("policy chat_template=true but the tokenizer has no chat template")
        self.chat_template = enabled

    def format_prompts(self, prompts: list[str]) -> list[str]:
        """Prompts as the model reads them (through the chat template when enabled)."""
        if not self.chat_template:
            return list(prompts)
        return [
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
            )
            for p in prompts
        ]

    def setup_training(self, rank: int, alpha: float, target_modules: list[str] | None) -> None:
        super().setup_training(rank, alpha, target_modules)
        # Updates of ~1e-5 relative size would round away in bf16 weights.
        self.trainable_in_float32()

    def export(self, directory: str | Path) -> Path:
        """LoRA: a peft adapter (``PeftModel.from_pretrained(base, directory)``); full
        fine-tune: ``save_pretrained`` (``AutoModelFor...from_pretrained(directory)``). Both
        with the tokenizer."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        cast(Any, self.network).save_pretrained(str(directory))  # a transformers or peft model
        self.tokenizer.save_pretrained(str(directory))
        return directory


class StopStrings:
    """Cutting completions at stop strings, for the autoregressive adapters (causal LMs and
    VLMs; a masked-diffusion LM has none, and a policy that had the method would pass as a
    ``CausalTokenPolicy``). Needs ``decode`` and ``tokenizer`` from ``TransformersPolicy``."""

    tokenizer: Any
    decode: Callable[[torch.Tensor, torch.Tensor], list[str]]

    def cut_at_stop_strings(
        self, tokens: torch.Tensor, mask: torch.Tensor, stop_strings: list[str]
    ) -> torch.Tensor:
        """``mask`` with every token after the one that completes a stop string removed."""
        mask = mask.clone()
        for row, text in enumerate(self.decode(tokens, mask)):
            if not any(s in text for s in stop_strings):
                continue
            ids = tokens[row][mask[row]].tolist()

            def holds(length: int, ids: list[int] = ids) -> bool:
                prefix = self.tokenizer.decode(ids[:length], skip_special_tokens=True)
                return any(s in prefix for s in stop_strings)

            # The shortest prefix whose text holds a stop string ends the completion; a longer
            # prefix holds it too, so bisect (log T decodes instead of T).
            low, high = 1, len(ids)
            while low < high:
                middle = (low + high) // 2
                low, high = (low, middle) if holds(middle) else (middle + 1, high)
            mask[row, low:] = False
        return mask
