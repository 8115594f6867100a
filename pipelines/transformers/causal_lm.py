"""Any transformers ``AutoModelForCausalLM`` as a token policy.

Loads model and tokenizer with transformers' own ``from_pretrained`` (hub id or local directory;
``trust_remote_code`` only when asked), formats prompts (optionally through the tokenizer's chat
template), samples completions with a key-value cache while recording token log-probs
(``samplers/autoregressive.py``), and re-scores ``log p(token | prefix)`` for training. LoRA
through peft, full fine-tuning, the reference policy and checkpoints come from
``TrainablePolicy``; ``export`` writes a peft adapter or a ``save_pretrained`` model plus the
tokenizer.

Layout of a batch (``pipelines/transformers/base.py``): prompts left-padded to ``P`` tokens,
completions right-padded to ``T``, so every completion starts at column ``P``; position ids count
real tokens only.
"""

from __future__ import annotations

import inspect
from typing import Any, cast

import torch

from loading.assets import embedded_asset_path
from loading.transformers_checkpoint import load_causal_lm
from pipelines.transformers.base import (
    POLICY_HINTS,
    StopStrings,
    TransformersPolicy,
    eos_ids,
    policy_checkpoint,
)
from samplers.autoregressive import Generation, TokenSampler, generate

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class CausalLMPolicy(TransformersPolicy, StopStrings):
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
            checkpoint = policy_checkpoint(pretrained, "causal LM")
            model, tokenizer = load_causal_lm(checkpoint, dtype, trust_remote_code, POLICY_HINTS)
        # Where an inference engine loads this model from (generation.engine=vllm): the
        # directory or hub id, or what an already built model was loaded from.
        self.checkpoint = str(pretrained or getattr(model, "name_or_path", "") or "")
        self._adopt(
            model,
            tokenizer,
            chat_template=chat_template,
            gradient_checkpointing=gradient_checkpointing,
            pad_fallback=tokenizer.eos_token,
        )
        self.max_prompt_length = max_prompt_length
        self.eos_token_ids = eos_ids(model, tokenizer)
        parameters = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    # -- prompts and text -------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, P]`` left-padded prompt ids and attention mask (the last ``max_prompt_length``
        tokens of each)."""
        return self._encode(
            prompts,
            add_special_tokens=not self.chat_template,  # the template adds its own
            max_length=self.max_prompt_length,
        )

    # -- sampling and scoring ---------------------------------------------------------------------
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
        del model_inputs  # text only
        module = self._active_module()

        # transformers 5.2x renamed ``past_key_values`` to ``cache`` (input and output).
        cache_name = self._cache_argument

        keep = {"logits_to_keep": 1} if self._logits_to_keep else {}

        def next_logits(ids, positions, attention, cache):
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
            lockstep=self.sharded,
        )

    def completion_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        length: int,
        model_inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[B, length, V]``: position ``t - 1`` predicts token ``t``; position ids count real
        tokens only, as in sampling."""
        del model_inputs  # text only
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        kwargs: dict[str, Any] = {}
        if self._logits_to_keep:  # only the logits that score completion tokens
            kwargs["logits_to_keep"] = length + 1
        logits = self._active_module()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, **kwargs
        ).logits
        return logits[:, -(length + 1) : -1]

    def engine_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Every weight of the model this policy samples from, under the checkpoint's names, for
        an inference engine to load: the parameters as they are under full fine-tuning; under
        LoRA the base weights with each adapted layer's ``W + (alpha / r) B A`` merged in (the
        engine then serves no adapter, and the policy's own weights are not touched, unlike
        peft's ``merge_adapter``). Detached views, not copies, where nothing is merged.

        Tied weights are listed under each of their names (``lm_head.weight`` beside the
        embedding): vLLM's in-place reload restores each of its layers on its own, and a layer
        that is sent nothing keeps its old tensors."""
        if not self.is_lora:
            state = self.network.state_dict(keep_vars=True)
            return [(name, value.detach()) for name, value in state.items()]
        from peft.tuners.lora import LoraLayer

        base = cast(Any, self.network).get_base_model()
        # Each concrete LoRA layer (Linear, Embedding, ...) defines get_delta_weight.
        deltas = {
            f"{name}.base_layer.weight": sum(
                cast(Any, module).get_delta_weight(adapter) for adapter in module.active_adapters
            )
            for name, module in base.named_modules()
            if isinstance(module, LoraLayer)
        }
        weights = []
        for name, tensor in base.state_dict(keep_vars=True).items():
            if ".lora_" in name:  # the adapter's own factors, already merged
                continue
            value = tensor.detach()
            if name in deltas:
                value = (value.float() + deltas[name]).to(value.dtype)
            weights.append((name.replace(".base_layer.", "."), value))
        return weights

    # -- training setup and export ------------------------------------------------------------------
    def default_lora_targets(self) -> list[str]:
        names = self.linear_layer_names()
        targets = [t for t in LORA_TARGETS if t in names]
        return targets or sorted(names - {"lm_head"})


EMBEDDED_COUNTDOWN_LM = embedded_asset_path("countdown_lm")


def countdown_lm(pretrained: str | None = None, **kwargs: Any) -> CausalLMPolicy:
    """The embedded 792k-parameter Countdown model (``scripts/build_countdown_lm.py``), or
    another checkpoint given as ``pretrained``."""
    return CausalLMPolicy(pretrained or str(EMBEDDED_COUNTDOWN_LM), **kwargs)


# It takes what CausalLMPolicy takes (genrl checks a config's keywords against this signature).
setattr(countdown_lm, "__signature__", inspect.signature(CausalLMPolicy))  # noqa: B010
