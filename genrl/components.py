"""Building a run's policy and reward models from its config, with errors that name the field."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from genrl.config import TrainConfig
from genrl.overrides import ConfigError
from genrl.protocols import Policy
from pipelines.loading import MissingExtraError, missing_extra


def build_policy_from(config: TrainConfig) -> Policy:
    """The adapter of ``config.policy`` (weights loaded, not yet set up for training)."""
    from pipelines import build_policy

    p = config.policy
    return _build(
        build_policy, p.name, "policy", pretrained=p.pretrained, **_policy_options(p), **p.kwargs
    )


def build_reward_from(config: TrainConfig, device: torch.device) -> Any:
    """The weighted ``CompositeReward`` of ``config.reward``; rewards that take a device get
    ``device`` (this process's accelerator) unless their spec sets one."""
    from reward_models import CompositeReward, build_reward

    return CompositeReward(
        [
            (
                _build(build_reward, spec.name, f"reward.{i}", **_reward_options(spec, device)),
                spec.weight,
            )
            for i, spec in enumerate(config.reward)
        ]
    )


def _build(factory: Any, name: str, field: str, /, **kwargs: Any) -> Any:
    """Build a registered policy/reward; wrong keyword arguments name the config field, and a
    missing optional library names the extra that installs it."""
    try:
        return factory(name, **kwargs)
    except TypeError as err:
        if "argument" not in str(err):
            raise
        raise ConfigError(f"{field}: cannot build {name!r} with {kwargs}: {err}") from err
    except MissingExtraError:
        raise
    except ImportError as err:
        # Adapters bring transformers with diffusers; reward models with the rewards extra.
        extra = "diffusers" if field == "policy" else "rewards"
        missing = missing_extra(err, f"{field} {name!r}", extra)
        if missing is None:
            raise
        raise missing from err


def _reward_options(spec: Any, device: torch.device) -> dict[str, Any]:
    """The spec's keyword arguments, plus ``device`` = this process's accelerator device when
    the reward takes one and the spec leaves it unset (a GPU run scores on its own GPU)."""
    from reward_models import REWARDS, reward_class

    kwargs = dict(spec.kwargs)
    takes_device = spec.name in REWARDS and "device" not in kwargs
    if takes_device and "device" in inspect.signature(reward_class(spec.name)).parameters:
        kwargs["device"] = device
    return kwargs


def _policy_options(p: Any) -> dict[str, Any]:
    """Generic policy settings, passed only when they differ from the default so that adapters
    without them (the embedded toy) still build."""
    options: dict[str, Any] = {}
    if p.dtype != "float32":
        options["dtype"] = p.dtype
    if p.gradient_checkpointing:
        options["gradient_checkpointing"] = True
    return options
