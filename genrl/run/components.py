"""Building a run's policy and reward models from its config, with errors that name the field."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from genrl.config.errors import ConfigError, unknown_message
from genrl.policies.protocols import Policy
from genrl.run.config import TrainConfig
from loading.extras import MissingExtraError, missing_extra


def build_policy_from(config: TrainConfig) -> Policy:
    """The adapter of ``config.policy`` (weights loaded, not yet set up for training)."""
    from pipelines import policy_class

    p = config.policy
    options = {
        "pretrained": p.pretrained,
        "dtype": p.dtype,
        "gradient_checkpointing": p.gradient_checkpointing,
        **p.kwargs,
    }
    return _build(lambda: policy_class(p.name, p.pretrained), p.name, "policy.kwargs", options)


def build_reward_from(config: TrainConfig, device: torch.device) -> Any:
    """The weighted ``CompositeReward`` of ``config.reward``; rewards that take a device get
    ``device`` (this process's accelerator) unless their spec sets one."""
    from reward_models import CompositeReward, build_reward, reward_class

    return CompositeReward(
        [
            (
                _build(
                    lambda spec=spec: reward_class(spec.name),
                    spec.name,
                    f"reward.{i}.kwargs",
                    _reward_options(spec, device),
                    # The registry builds the inner rewards of a wrapper (nested_rewards).
                    build=lambda spec=spec, **kwargs: build_reward(spec.name, **kwargs),
                ),
                spec.weight,
            )
            for i, spec in enumerate(config.reward)
        ]
    )


def _build(target: Any, name: str, field: str, kwargs: dict[str, Any], build: Any = None) -> Any:
    """Build a registered policy/reward from ``target()`` (its class or factory, imported on
    first use; ``build(**kwargs)`` instead of calling it, when given): a keyword its signature does not take is named with the config field and the
    nearest accepted one, and a missing optional library (at import or when the adapter loads
    it) names the extra that installs it."""
    try:
        factory = target()
        accepted = accepted_keywords(factory)
        unknown = [key for key in kwargs if accepted is not None and key not in accepted]
        if unknown:
            assert accepted is not None
            raise ConfigError(
                unknown_message(unknown[0], sorted(accepted), f"{field}.{unknown[0]}")
                + f" ({name!r} takes no such keyword)"
            )
        return (build or factory)(**kwargs)
    except MissingExtraError:
        raise
    except ImportError as err:
        # Adapters bring transformers with diffusers; reward models with the rewards extra.
        extra = "diffusers" if field.startswith("policy") else "rewards"
        missing = missing_extra(err, f"{field.split('.')[0]} {name!r}", extra)
        if missing is None:
            raise
        raise missing from err


def accepted_keywords(factory: Any) -> set[str] | None:
    """The keyword names ``factory`` (a class or function) accepts, following a class's
    ``**kwargs`` into the ``__init__`` of its bases; None when it takes any keyword without
    forwarding it to a signature we can read."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if inspect.isclass(factory):
        inits = [k.__dict__["__init__"] for k in factory.__mro__ if "__init__" in k.__dict__]
        signatures = [inspect.signature(init) for init in inits]
    else:
        signatures = [inspect.signature(factory)]
    names: set[str] = set()
    for signature in signatures:
        parameters = signature.parameters.values()
        names |= {p.name for p in parameters if p.kind in named and p.name != "self"}
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return names
    return None


def _reward_options(spec: Any, device: torch.device) -> dict[str, Any]:
    """The spec's keyword arguments, plus ``device`` = this process's accelerator device when
    the reward takes one and the spec leaves it unset (a GPU run scores on its own GPU)."""
    from reward_models import REWARDS, reward_class

    kwargs = dict(spec.kwargs)
    takes_device = spec.name in REWARDS and "device" not in kwargs
    if takes_device and "device" in inspect.signature(reward_class(spec.name)).parameters:
        kwargs["device"] = device
    return kwargs
