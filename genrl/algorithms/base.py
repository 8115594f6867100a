"""The algorithm contract and registry.

An algorithm is one file holding a documented ``Config`` dataclass and an ``Algorithm`` subclass
that says how to collect a rollout, how to turn rewards into advantages, how to flatten a rollout
into training units and what the loss on a minibatch of units is. The trainer calls these hooks
in its numbered phases and knows no algorithm by name.
"""

from __future__ import annotations

import abc
import math
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

    def validate(self, train_config: Any = None) -> None:
        """Raise ``ConfigError`` naming the offending field; ``train_config`` (the whole
        ``TrainConfig``) lets an algorithm check the settings it depends on elsewhere."""


class RolloutNoise:
    """The random streams of one iteration, reproducible from ``(seed, iteration)``.

    With ``layout="global"`` (default) per-sample randomness is drawn for the *global* batch and
    each process keeps its slice, so a sample gets the same noise on 1 or N processes and after a
    resume. That costs each process a draw for the whole batch; ``layout="local"`` draws only the
    process's own samples from a stream that also depends on its slice (cheaper for very large
    batches, still exact on resume, but not identical across process counts).
    """

    def __init__(
        self,
        seed: int,
        iteration: int,
        num_global: int,
        local: slice,
        layout: str = "global",
        round_index: int = 0,
    ) -> None:
        if layout not in ("global", "local"):
            raise ValueError(f"noise layout must be 'global' or 'local', got {layout!r}")
        self.seed = seed
        self.iteration = iteration
        self.num_global = num_global
        self.local = local
        self.layout = layout
        self.round_index = (
            round_index  # refill round of dynamic sampling (0: the iteration's first batch)
        )

    @property
    def num_local(self) -> int:
        return self.local.stop - self.local.start

    def generator(self, tag: int) -> torch.Generator:
        """A CPU generator for stream ``tag``, the same on every process."""
        # Large odd multipliers keep neighbouring iterations and tags from colliding.
        key = self.seed * 1_000_003 + self.iteration * 7_919 + tag * 104_729
        return torch.Generator().manual_seed((key + self.round_index * 15_485_867) % (2**63 - 1))

    def _per_sample(self, draw: Any, tag: int, shape: tuple[int, ...]) -> torch.Tensor:
        if self.layout == "global":
            return draw((self.num_global, *shape), generator=self.generator(tag))[self.local]
        # A stream per (tag, slice start): distinct across processes, fixed across resumes.
        return draw(
            (self.num_local, *shape), generator=self.generator(tag * 65_537 + self.local.start)
        )

    def randn(
        self, tag: int, event_shape: tuple[int, ...], device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """``[n_local, *event_shape]`` standard-normal noise for stream ``tag`` on ``device``
        (drawn on the CPU, so the numbers do not depend on the accelerator)."""
        return self._per_sample(torch.randn, tag, event_shape).to(device)

    def randn_by_sample(
        self, tag: int, event_shape: tuple[int, ...], device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """``[n_local, *event_shape]`` standard-normal noise, each sample from its own stream
        seeded from stream ``tag`` of the global batch: the same numbers on any number of
        processes (like ``layout="global"``) at the cost of this process's samples only (large
        per-sample draws, e.g. several noisings of a 512 px latent)."""
        seeds = torch.randint(2**62, (self.num_global,), generator=self.generator(tag))
        rows = [
            torch.randn(event_shape, generator=torch.Generator().manual_seed(int(seed)))
            for seed in seeds[self.local].tolist()
        ]
        if not rows:
            return torch.zeros((0, *event_shape), device=device)
        return torch.stack(rows).to(device)

    def randn_per_group(
        self,
        tag: int,
        event_shape: tuple[int, ...],
        group_ids: torch.Tensor,
        num_groups: int,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """Standard-normal noise shared by the samples of a group: ``[len(group_ids), *event]``
        where row ``i`` is the draw of group ``group_ids[i]`` (ids in ``[0, num_groups)``).
        Drawn for all groups, so it does not depend on how groups are split over processes."""
        ids = group_ids.cpu()
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= num_groups):
            raise ValueError(f"group ids must lie in [0, {num_groups}), got {ids.tolist()}")
        table = torch.randn((num_groups, *event_shape), generator=self.generator(tag))
        return table[ids].to(device)

    def rand(self, tag: int, shape: tuple[int, ...]) -> torch.Tensor:
        """``[n_local, *shape]`` uniform numbers for stream ``tag`` (CPU)."""
        return self._per_sample(torch.rand, tag, shape)

    def device_generator(self, tag: int, device: torch.device | str) -> torch.Generator:
        """A generator on ``device`` for this process's slice, for samplers that draw on the
        accelerator (token sampling): reproducible on resume, but, like ``layout="local"``,
        dependent on the process layout."""
        seed = torch.randint(2**62, (1,), generator=self.generator(tag * 65_537 + self.local.start))
        return torch.Generator(device).manual_seed(int(seed))

    def local_permutation(self, tag: int, n: int) -> torch.Tensor:
        """A permutation of this process's ``n`` training units (differs across processes)."""
        return torch.randperm(n, generator=self.generator(tag * 65_537 + self.local.start))


@dataclass(frozen=True)
class StepContext:
    """What a loss may need to know about the optimizer step its minibatch belongs to.

    Attributes:
        minibatches: minibatches accumulated into the step on each process.
        tokens_per_minibatch: mean number of loss tokens per minibatch over the step's
            minibatches on all processes (for a token mean over the whole step, DAPO's); None
            when the algorithm does not count tokens.
    """

    minibatches: int = 1
    tokens_per_minibatch: float | None = None


class Algorithm(abc.ABC):
    """Hooks the trainer calls; see DESIGN.md section 2 for the phases."""

    Config: ClassVar[type[AlgorithmConfig]]
    needs_groups: ClassVar[bool] = True
    """True when advantages compare the samples of a prompt's group (every group-relative
    method): ``TrainConfig.validate`` then rejects ``train.group_size < 2``, where each sample
    would be its own baseline. An algorithm with a learned or running baseline sets False."""
    supports_offline: ClassVar[bool] = False
    """True when the loss needs only clean samples and rewards, so iterations may read groups
    from an offline store (``train.offline_store``); such algorithms implement
    ``rollout_from_samples(prompts, group_ids, condition, samples)``."""

    def __init__(self, config: AlgorithmConfig, train_config: TrainConfig) -> None:
        self.config = config
        self.train_config = train_config

    def setup(self, policy: Any) -> None:
        """Bind to the policy before training (e.g. build samplers on the model's own noise
        schedule). Called once by the trainer, after the policy is built."""
        del policy

    @abc.abstractmethod
    def collect(
        self, policy: Any, prompts: list[str], group_ids: torch.Tensor, noise: RolloutNoise
    ) -> Batch:
        """Phase 2: sample this process's part of the batch (no gradients)."""

    @abc.abstractmethod
    def final_outputs(self, policy: Any, rollout: Batch) -> torch.Tensor:
        """Decoded outputs of a rollout for the reward models (e.g. images ``[N, C, H, W]``)."""

    def advantage_inputs(self, rollout: Batch) -> dict[str, torch.Tensor]:
        """Per-sample tensors ``[n, ...]`` of this process's rollout that ``advantages`` needs
        besides the rewards (e.g. per-step KL estimates, a tree's edge log-probs); the trainer
        gathers them over processes and passes them as keyword arguments."""
        del rollout
        return {}

    @abc.abstractmethod
    def advantages(
        self,
        rewards: torch.Tensor,
        prompts: list[str],
        group_ids: torch.Tensor,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        """Phase 4: advantages of the gathered batch (all processes): ``[N]``, or ``[N, T]``
        with one advantage per sample and step. ``inputs`` are ``advantage_inputs``, gathered."""

    @abc.abstractmethod
    def training_units(self, rollout: Batch, noise: RolloutNoise) -> Batch:
        """Flatten a rollout (advantages filled) into units that minibatches are drawn from."""

    def num_units(self, num_samples: int) -> int:
        """How many training units ``training_units`` makes from ``num_samples`` samples (used to
        plan the learning-rate schedule before training starts)."""
        return num_samples

    @abc.abstractmethod
    def loss(
        self, policy: Any, minibatch: Batch, step: StepContext | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Phase 5: the scalar loss of a minibatch of units, with metrics. The trainer divides
        it by ``step.minibatches`` and processes average their gradients."""

    def loss_tokens(self, units: Batch) -> int | None:
        """How many loss tokens these units hold, when the loss normalises by the tokens of a
        whole optimizer step (DAPO's token mean); None otherwise."""
        del units
        return None

    def reward_metadata(self, rollout: Batch) -> list[dict[str, Any]] | None:
        """Per-sample extras handed to the reward models (TRL's ``**columns``), e.g. completion
        lengths for an overlong penalty; None when there are none."""
        del rollout
        return None

    def evaluation_outputs(
        self, policy: Any, prompts: list[str], samples_per_prompt: int, seed: int
    ) -> Callable[[list[str], slice], Any] | None:
        """How held-out outputs are made (``genrl.evaluation.evaluate``'s ``outputs_fn``); None
        uses the flow default, deterministic ODE samples from fixed-seed noise."""
        del policy, prompts, samples_per_prompt, seed
        return None

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a resume (e.g. reward statistics)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


def updates_once(train_config: Any, units: int) -> bool:
    """Whether an iteration of ``units`` training units (on this process) takes exactly one
    optimizer step with one pass: then every loss sees the parameters that sampled the rollout,
    so its old log-probs are the current ones, detached, and need no forward of their own (as
    TRL skips ``old_per_token_logps``)."""
    t = train_config.train
    return (
        t.inner_epochs == 1 and math.ceil(units / t.minibatch_size) <= t.gradient_accumulation_steps
    )


ALGORITHMS: dict[str, type[Algorithm]] = {}


def register_algorithm(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator adding an algorithm to the registry under ``name``."""

    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        if name in ALGORITHMS:
            raise ValueError(f"algorithm {name!r} is registered twice")
        ALGORITHMS[name] = cls
        return cls

    return decorate
