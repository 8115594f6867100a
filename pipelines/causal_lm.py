"""Any transformers ``AutoModelForCausalLM`` as a token policy.

Loads model and tokenizer with transformers' own ``from_pretrained`` (hub id or local directory;
``trust_remote_code`` only when asked), formats prompts (optionally through the tokenizer's chat
template), samples completions with a key-value cache while recording token log-probs
(``samplers/autoregressive.py``), and re-scores ``log p(token | prefix)`` for training. LoRA
through peft, full fine-tuning, the reference policy and checkpoints come from
``TrainablePolicy``; ``export`` writes a peft adapter or a ``save_pretrained`` model plus the
tokenizer.

Layout of a batch: prompts left-padded to ``P`` tokens, completions right-padded to ``T``, so
every completion starts at column ``P``; position ids count real tokens only.
"""

from __future__ import annotations

import inspect
from itertools import compress
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipelines.base import disable_dropout
from pipelines.transformers_base import TransformersPolicy, load_model_and_tokenizer
from samplers.autoregressive import Generation, TokenSampler, generate

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class CausalLMPolicy(TransformersPolicy):
    """A causal language model as a policy.

    Args:
        pretrained: hub id or local directory with the model and its tokenizer.
        dtype: storage dtype of the frozen weights; trainable weights stay float32.
        gradient_checkpointing: recompute activations in the backward pass.
        chat_template: wrap each prompt as a user message with the tokenizer's chat template.
        max_prompt_length: keep the last this many prompt tokens (None: no limit).
        trust_remote_code: allow the checkpoint's own modelling code (off by default).
        model, tokenizer: already built objects instead of ``pretrained`` (tests, notebooks).
    """

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        chat_template: bool = False,
        max_prompt_length: int | None = None,
        trust_remote_code: bool = False,
        model: Any = None,
        tokenizer: Any = None,
    ) -> None:
        super().__init__()
        if model is None or tokenizer is None:
            from transformers import AutoModelForCausalLM

            model, tokenizer = load_model_and_tokenizer(
                pretrained,
                dtype,
                trust_remote_code,
                AutoModelForCausalLM.from_pretrained,
                "causal LM",
            )
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token  # batched prompts need a pad id
        self.use_chat_template(chat_template)
        self.max_prompt_length = max_prompt_length
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        disable_dropout(model)
        self.network: nn.Module = model.requires_grad_(False)
        self.module = self.network
        self.eos_token_ids = eos_ids(model, tokenizer)
        parameters = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    # -- prompts and text -------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, P]`` left-padded prompt ids and attention mask (on the model's device).

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
            truncation=self.max_prompt_length is not None,
            max_length=self.max_prompt_length,
            add_special_tokens=not self.chat_template,  # the template adds its own
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

    # -- sampling and scoring ---------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        sampler: TokenSampler,
        max_new_tokens: int,
        generator: torch.Generator | None = None,
    ) -> Generation:
        module = self._active_module()

        # transformers 5.2x renamed ``past_key_values`` to ``cache`` (input and output).
        cache_name = self._cache_argument

        keep = {"logits_to_keep": 1} if self._logits_to_keep else {}

        def next_logits(ids, positions, attention, cache):  # type: ignore[no-untyped-def]
            out = module(
                input_ids=ids,
                attention_mask=attention,
                position_ids=positions,
                use_cache=True,
                **{cache_name: cache},
                **keep,  # the prompt forward needs the last position's logits only
            )
            return out.logits[:, -1], getattr(out, cache_name)

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

    def token_log_probs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_start: int,
        sampler: TokenSampler,
    ) -> torch.Tensor:
        """``[B, T]`` float32 ``log p(x_t | x_<t)`` of the completion tokens
        ``input_ids[:, completion_start:]`` under the active (or reference) model."""
        module = self._active_module()
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        num_completion = input_ids.shape[1] - completion_start
        kwargs: dict[str, Any] = {}
        if self._logits_to_keep:  # only the logits that score completion tokens
            kwargs["logits_to_keep"] = num_completion + 1
        logits = module(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, **kwargs
        ).logits
        logits = logits[:, -(num_completion + 1) : -1]  # position t-1 predicts token t
        return sampler.selected_log_probs(logits, input_ids[:, completion_start:])

    # -- training setup and export ------------------------------------------------------------------
    def default_lora_targets(self) -> list[str]:
        names = {
            n.rsplit(".", 1)[-1]
            for n, m in self.network.named_modules()
            if isinstance(m, nn.Linear)
        }
        targets = [t for t in LORA_TARGETS if t in names]
        return targets or sorted(names - {"lm_head"})


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


EMBEDDED_COUNTDOWN_LM = Path(__file__).resolve().parents[1] / "genrl" / "assets" / "countdown_lm"


def countdown_lm(pretrained: str | None = None, **kwargs: Any) -> CausalLMPolicy:
    """The embedded 308k-parameter Countdown model (``scripts/build_countdown_lm.py``), or
    another checkpoint given as ``pretrained``."""
    return CausalLMPolicy(pretrained or str(EMBEDDED_COUNTDOWN_LM), **kwargs)
