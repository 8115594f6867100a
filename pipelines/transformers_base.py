"""What the token policies built on transformers checkpoints share: loading model and tokenizer
with clear errors, and saving in the ecosystem's format (a peft adapter or ``save_pretrained``,
with the tokenizer)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipelines.base import TrainablePolicy
from pipelines.loading import require_local_or_reachable

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model_and_tokenizer(
    pretrained: str | None,
    dtype: str,
    trust_remote_code: bool,
    load_model: Callable[..., Any],
    kind: str,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a hub id or directory; errors name the checkpoint and say
    when custom modelling code would need ``trust_remote_code``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if not pretrained:
        raise ValueError(f"policy {kind} needs policy.pretrained: a hub id or a local directory")
    from transformers import AutoTokenizer

    require_local_or_reachable(
        pretrained, "--set policy.pretrained=DIR (a directory written by save_pretrained)"
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(pretrained, trust_remote_code=trust_remote_code)
        model = load_model(pretrained, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        first_line = (str(err).strip().splitlines() or [repr(err)])[0]
        hint = (
            ""
            if trust_remote_code
            else (" (custom model code needs policy.kwargs.trust_remote_code=true)")
        )
        raise ValueError(f"cannot load {pretrained!r} as a {kind}: {first_line}{hint}") from err
    return model, tokenizer


class TransformersPolicy(TrainablePolicy):
    """Base of ``CausalLMPolicy`` and ``MaskedLMPolicy``: float32 trainable weights whatever
    the storage dtype, and export with the tokenizer."""

    tokenizer: Any
    chat_template: bool = False

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
        for parameter in self.trainable_parameters():
            parameter.data = parameter.data.float()

    def export(self, directory: str | Path) -> Path:
        """LoRA: a peft adapter (``PeftModel.from_pretrained(base, directory)``); full
        fine-tune: ``save_pretrained`` (``AutoModelFor...from_pretrained(directory)``). Both
        with the tokenizer."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.network.save_pretrained(str(directory))
        self.tokenizer.save_pretrained(str(directory))
        return directory
