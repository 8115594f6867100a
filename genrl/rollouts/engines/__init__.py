"""Rollout engines of the token policies, built by name (``generation.engine``).

The registry maps a name to a ``"module:Class"`` string imported only when the engine is built,
so that importing genrl never imports an inference engine; ``REQUIRES`` names the library an
engine needs, so that a run asking for one that is not installed fails at config time with one
line, not deep in the first rollout. Nothing here imports torch: the config check runs before
torch loads (``genrl/rollouts/configs.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from genrl.config.errors import ConfigError, unknown_message

if TYPE_CHECKING:
    from genrl.rollouts.engines.base import TokenEngine

# name -> "module:Class" of a ``TokenEngine``.
ENGINES: dict[str, str] = {
    "loop": "genrl.rollouts.engines.loop:LoopEngine",
    "vllm": "genrl.rollouts.engines.vllm_engine:VLLMEngine",
    "vllm_server": "genrl.rollouts.engines.vllm_server:VLLMServerEngine",
}

# name -> the importable module an engine needs (engines not listed need nothing beyond genrl).
REQUIRES: dict[str, str] = {"vllm": "vllm", "vllm_server": "httpx"}

# How to get what an engine needs, for its missing-library error.
INSTALL_HINT = (
    "build the engine virtualenv with `bash .ci/vllm_lane --install-only` and run genrl from "
    "it (docs/algorithms/grpo.md, 'Rollouts on an inference engine')"
)


def check_engine(name: str) -> None:
    """Raise ``ConfigError`` (one line) for an unknown engine or one whose library is missing."""
    if name not in ENGINES:
        raise ConfigError(unknown_message(name, list(ENGINES), "generation.engine", value=True))
    module = REQUIRES.get(name)
    if module is not None and importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"generation.engine={name} needs the {module} package, which is not installed "
            f"here: {INSTALL_HINT}"
        )


def build_engine(name: str, train_config: Any) -> TokenEngine:
    """The engine registered as ``name``, for the run ``train_config``."""
    check_engine(name)
    module_name, class_name = ENGINES[name].split(":")
    engine: TokenEngine = getattr(importlib.import_module(module_name), class_name)(train_config)
    return engine


__all__ = ["ENGINES", "REQUIRES", "build_engine", "check_engine"]
