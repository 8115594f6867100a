"""What differs between vision-language families in the forward ``VLMPolicy`` makes, as one
table keyed by the config's ``model_type`` instead of branches in the adapter.

One fact differs, and only for some families: **token types**, a per-token input some forwards take besides the ids. Each is rebuilt from
  the prompt's ids (a completion is text, whatever ids a policy samples), and its completion
  columns get the family's value for generated text:

  - ``mm_token_type_ids`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL; found by the forward's signature,
    so the family's later members need no entry): 1 on image tokens, 2 on video tokens, 0 on
    text and the completion; the model's ``get_rope_index`` reads them;
  - Gemma 3's ``token_type_ids``: 1 on image tokens, which attend to each other both ways;
  - PaliGemma's ``token_type_ids``: 0 on the whole prompt (the "prefix": the image tokens, the
    text and its separator, attending to each other both ways), 1 on the completion (the
    "suffix", causal): the prefix-LM masking of PaliGemma (Beyer et al. 2024,
    arXiv:2407.07726).

A family absent from the table reads no token types: LLaVA, LLaVA-NeXT, Idefics3 and SmolVLM
need nothing. Positions need no entry: PaliGemma's forward counts them from 1 where genrl counts
real tokens from 0, a shift of every position that rotary embeddings do not see (attention
reads only position differences; measured: the same log-probs to 4.8e-7 either way).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def image_and_video_tokens(input_ids: torch.Tensor, config: Any) -> torch.Tensor:
    """Qwen's ``mm_token_type_ids``: 1 on image tokens, 2 on video tokens, 0 elsewhere."""
    types = (input_ids == config.image_token_id).long()
    video = getattr(config, "video_token_id", None)
    if video is not None:
        types = types + 2 * (input_ids == video).long()
    return types


def image_tokens(input_ids: torch.Tensor, config: Any) -> torch.Tensor:
    """1 on image tokens, 0 elsewhere (Gemma 3's bidirectional image blocks)."""
    return (input_ids == config.image_token_id).long()


def whole_prefix(input_ids: torch.Tensor, config: Any) -> torch.Tensor:
    """0 on every prompt token: PaliGemma's prefix, attended both ways."""
    del config
    return torch.zeros_like(input_ids)


@dataclass(frozen=True)
class TokenTypes:
    """A forward's per-token types.

    Attributes:
        argument: the forward's keyword that takes them.
        prompt: the types of ``[B, L]`` ids from the model's config (the completion columns
            are overwritten with ``completion``).
        completion: the type of a generated (text) token.
    """

    argument: str
    prompt: Callable[[torch.Tensor, Any], torch.Tensor]
    completion: int = 0

    def of(self, input_ids: torch.Tensor, config: Any, completion_length: int) -> torch.Tensor:
        """``[B, L]`` types for the prompt followed by ``completion_length`` generated tokens."""
        types = self.prompt(input_ids, config)
        if completion_length:
            types[:, -completion_length:] = self.completion
        return types


@dataclass(frozen=True)
class VLMFamily:
    """What one family's forward needs besides ids, mask, pixels and positions.

    Attributes:
        token_types: the per-token types its forward takes, or None.
    """

    token_types: TokenTypes | None = None


QWEN_TYPES = TokenTypes("mm_token_type_ids", image_and_video_tokens)

FAMILIES: dict[str, VLMFamily] = {
    "gemma3": VLMFamily(TokenTypes("token_type_ids", image_tokens)),
    "paligemma": VLMFamily(TokenTypes("token_type_ids", whole_prefix, completion=1)),
}


def vlm_family(model_type: str, forward_parameters: set[str]) -> VLMFamily:
    """The family entry of a model: its table row, else Qwen's token types when its forward
    takes ``mm_token_type_ids``, else nothing."""
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    if "mm_token_type_ids" in forward_parameters:
        return VLMFamily(QWEN_TYPES)
    return VLMFamily()
