"""The algorithm contract and registry.

An algorithm is one file holding a documented ``Config`` dataclass and an ``Algorithm`` subclass
that says how to collect a rollout, how to turn rewards into advantages, how to flatten a rollout
into training units and what the loss on a minibatch of units is. The trainer calls these hooks
in its numbered phases and knows no algorithm by name.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from genrl.config import TrainConfig
    from genrl.rollout import Batch


@dataclass
class AlgorithmConfig:
    """Base of every algorithm's config; ``name`` selects the algorithm in the registry."""

    name: str = ""

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the offending field; subclasses extend."""


class RolloutNoise:
    """Standard-normal noise for one iteration that does not depend on the process layout.

    Noise is drawn for the *global* batch from a generator seeded by ``(seed, iteration, tag)`` and
    each process keeps its own slice, so a sample gets the same noise on 1 or N processes and after
    a resume. The cost (drawing the whole batch's noise on every process) is negligible next to a
    model forward.
    """

    def __init__(self, seed: int, iteration: int, num_global: int, local: slice) -> None:
        self.seed = seed
        self.iteration = iteration
        self.num_global = num_global
        self.local = local

    def generator(self, tag: int) -> torch.Generator:
        # Distinct, reproducible streams per (seed, iteration, tag); large odd multipliers keep
        # neighbouring iterations and tags from colliding.
        return torch.Generator().manual_seed(
            (self.seed * 1_000_003 + self.iteration * 7_919 + tag * 104_729) % (2**63 - 1)
        )

    def randn(
        self, tag: int, event_shape: tuple[int, ...], device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """``[n_local, *event_shape]`` float32 noise for stream ``tag`` on ``device``.

        Drawn on the CPU so that the numbers do not depend on the accelerator either.
        """
        full = torch.randn((self.num_global, *event_shape), generator=self.generator(tag))
        return full[self.local].to(device)

    def permutation(self, tag: int, n: int) -> torch.Tensor:
        """A reproducible permutation of ``range(n)`` for stream ``tag``."""
        return torch.randperm(n, generator=self.generator(tag))


class Algorithm(abc.ABC):
    """Hooks the trainer calls; see DESIGN.md section 2 for the phases."""

    Config: ClassVar[type[AlgorithmConfig]]

    def __init__(self, config: AlgorithmConfig, train_config: TrainConfig) -> None:
        self.config = config
        self.train_config = train_config

    @abc.abstractmethod
    def collect(
        self, policy: Any, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> Batch:
        """Phase 2: sample this process's part of the batch (no gradients)."""

    @abc.abstractmethod
    def final_outputs(self, policy: Any, rollout: Batch) -> torch.Tensor:
        """Decoded outputs of a rollout for the reward models (e.g. images ``[N, C, H, W]``)."""

    @abc.abstractmethod
    def advantages(
        self, rewards: torch.Tensor, prompts: list[str], group_ids: torch.Tensor
    ) -> torch.Tensor:
        """Phase 4: ``[N]`` advantages of the gathered batch (all processes)."""

    @abc.abstractmethod
    def training_units(self, rollout: Batch, noise: RolloutNoise) -> Batch:
        """Flatten a rollout (advantages filled) into units that minibatches are drawn from."""

    def num_units(self, num_samples: int) -> int:
        """How many training units ``training_units`` makes from ``num_samples`` samples (used to
        plan the learning-rate schedule before training starts)."""
        return num_samples

    @abc.abstractmethod
    def loss(self, policy: Any, minibatch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Phase 5: the scalar loss of a minibatch of units, with metrics."""

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a resume (e.g. reward statistics)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


ALGORITHMS: dict[str, type[Algorithm]] = {}


def register_algorithm(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator adding an algorithm to the registry under ``name``."""

    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        if name in ALGORITHMS:
            raise ValueError(f"algorithm {name!r} is registered twice")
        ALGORITHMS[name] = cls
        return cls

    return decorate
