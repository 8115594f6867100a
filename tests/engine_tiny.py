"""A tiny random Qwen3 that the CPU build of vLLM can serve, for the rollout-engine tests.

It keeps the shipped Countdown LM's configuration and tokenizer (so the Countdown task and
reward apply) with random float32 weights, saved with ``save_pretrained`` like a hub checkpoint,
and heads of ``head_dim`` dimensions: 32 by default, what vLLM's CPU attention kernel needs
(narrower heads test its refusal)."""

from __future__ import annotations

from pathlib import Path

import torch

from loading.assets import embedded_asset_path

COUNTDOWN_LM = embedded_asset_path("countdown_lm")


def save_engine_lm(directory: Path, seed: int = 0, head_dim: int = 32) -> Path:
    """The model and the Countdown tokenizer in ``directory``; returns it."""
    from transformers import AutoConfig, AutoTokenizer, Qwen3ForCausalLM

    config = AutoConfig.from_pretrained(COUNTDOWN_LM)
    config.head_dim = head_dim
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).float().save_pretrained(directory)
    AutoTokenizer.from_pretrained(COUNTDOWN_LM).save_pretrained(directory)
    return directory
