"""The algorithm contract and registry.

An algorithm is a registered pairing of a rollout (how samples are made,
``genrl/rollouts/``) and an objective (what is learned from them, ``genrl/objectives/``) with one
documented ``Config``: one file per algorithm. The trainer builds the pair once (``build``) and
calls the rollout and the objective in its numbered phases; it knows no algorithm by name.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from genrl.objectives.base import Objective
    from genrl.policies.protocols import Policy
    from genrl.rollouts.base import Rollout


@dataclass
class AlgorithmConfig:
    """Base of every algorithm's config; ``name`` selects the algorithm in the registry."""

    name: str = ""

    def validate(self, train_config: Any = None) -> None:
        """Raise ``ConfigError`` naming the offending field; ``train_config`` (the whole
        ``TrainConfig``) lets an algorithm check the settings it depends on elsewhere."""


class Algorithm(abc.ABC):
    """A registered pairing of a rollout and an objective (docs/architecture.md, section 3)."""

    Config: ClassVar[type[AlgorithmConfig]]
    needs_groups: ClassVar[bool] = True
    """True when advantages compare the samples of a prompt's group (every group-relative
    method): ``TrainConfig.validate`` then rejects ``train.group_size < 2``, where each sample
    would be its own baseline. An algorithm with a learned or running baseline sets False."""
    supports_offline: ClassVar[bool] = False
    """True when the objective needs only clean samples and rewards, so iterations may read
    groups from an offline store (``train.offline_store``) through the rollout's
    ``from_stored(policy, prompts, group_ids, samples)``."""
    sections: ClassVar[dict[str, type]] = {}
    """The config sections its rollout reads and their classes, e.g.
    ``{"sampler": SDESamplingConfig}``; ``TrainConfig`` holds exactly these."""
    group_units: ClassVar[bool] = False
    """True when every training unit holds a whole group, so each process needs whole groups."""
    fixed_group_shape: ClassVar[bool] = False
    """True when the rollout draws every group in one shape of ``train.group_size`` samples (a
    tree), so an allocation policy's per-prompt sample counts cannot apply."""

    def __init__(self, config: AlgorithmConfig, train_config: Any) -> None:
        # train_config is the run's TrainConfig (genrl/run/config.py), typed Any as in the
        # rollouts and objectives: that module is built on this registry and sits above it.
        self.config = config
        self.train_config = train_config

    @abc.abstractmethod
    def build(self, policy: Policy) -> tuple[Rollout[Any, Any], Objective[Any, Any, Any]]:
        """The rollout and the objective of a run, bound to its policy (e.g. samplers on the
        model's own noise schedule). Called once, after the policy is set up for training;
        refuses (``genrl.policies.protocols.require``) a policy of the wrong kind."""


ALGORITHMS: dict[str, type[Algorithm]] = {}


def register_algorithm(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator adding an algorithm to the registry under ``name``."""

    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        if name in ALGORITHMS:
            raise ValueError(f"algorithm {name!r} is registered twice")
        ALGORITHMS[name] = cls
        return cls

    return decorate


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmConfig",
    "register_algorithm",
]
