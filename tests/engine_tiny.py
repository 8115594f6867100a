"""A tiny random Qwen3 that the CPU build of vLLM can serve, for the rollout-engine tests.

The shipped Countdown LM has head_dim 24, below the 32 that vLLM's CPU attention kernel needs;
this model keeps its tokenizer (so the Countdown task and reward apply) and its 64 positions,
with head_dim 32 and random float32 weights, saved with ``save_pretrained`` like a hub
checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

from loading.assets import embedded_asset_path

COUNTDOWN_LM = embedded_asset_path("countdown_lm")


def save_engine_lm(directory: Path, seed: int = 0) -> Path:
    """The model and the Countdown tokenizer in ``directory``; returns it."""
    from transformers import AutoConfig, AutoTokenizer, Qwen3ForCausalLM

    config = AutoConfig.from_pretrained(COUNTDOWN_LM)
    config.head_dim = 32
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).float().save_pretrained(directory)
    AutoTokenizer.from_pretrained(COUNTDOWN_LM).save_pretrained(directory)
    return directory
