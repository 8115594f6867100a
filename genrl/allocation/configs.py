"""The ``allocation.*`` config section, without torch (read by the config checks).

``allocation.name`` picks the policy (``genrl/allocation/registry.py``, ``ALLOCATIONS``); each
policy reads its own subsection (``allocation.pilot_commit.*``, ``allocation.sorted_groups.*``),
and the others are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from genrl.config.errors import ConfigError


@dataclass
class PilotCommitConfig:
    """Pilot-Commit (Kim et al. 2026, "Spend Your Rollouts Where It Counts"); defaults from the
    released code's 1.5B script (``pc_qwen2.5-1.5b_p32c96.sh``) where it sets them, else from
    its ``pc_trainer.yaml``. The commit stage draws ``train.group_size`` fresh samples per
    committed prompt (verl's ``rollout.n``), so a training group holds
    ``kept_pilot_samples + train.group_size`` samples."""

    pilot_samples: int = 8
    """Samples per explored prompt in the pilot stage (``exploration.n``; the scripts use 32
    with 96 committed, 16 with 48)."""
    kept_pilot_samples: int = 0
    """Pilot samples of a committed prompt that join its training group
    (``exploration.n_effective``); 0 keeps all ``pilot_samples``."""
    pilot_prompts_factor: int = 3
    """Prompts explored per round, as a multiple of ``train.prompts_per_iteration`` (the scripts'
    ``gen_prompt_bsz = train_prompt_bsz * 3``)."""
    too_hard_below: float = 0.125
    """A prompt whose pilot mean of ``allocation.metric`` is below this is not committed
    (``diversity_threshold_lower``)."""
    too_easy_above: float = 0.75
    """... or above this (``1 - diversity_threshold_upper``, 0.25 in the scripts)."""
    evict_at: float | None = 1.0
    """A prompt whose pilot mean reaches this is never explored again
    (``exclude_threshold_upper``; the released code excludes it from the next epoch's
    dataloader, here from every later draw); None keeps every prompt."""
    max_off_iterations: int = 4
    """Pilot samples older than this many iterations leave the buffer
    (``buffer_max_off_steps``)."""
    prompt_choice: Literal["max_variance", "random", "most_recent", "least_recent"] = "max_variance"
    """Which buffered prompts are committed when there are more than needed
    (``buffer_sampling_method``): the highest pilot std first (ties: the newest), at random,
    the newest or the oldest."""
    response_choice: Literal["max_variance", "first_n"] = "max_variance"
    """Which pilot samples are kept when ``kept_pilot_samples < pilot_samples``
    (``buffer_response_sampling_method``): half correct and half wrong where possible, or the
    first ones."""
    max_rounds: int = 10
    """Hard cap on rounds per iteration (``max_num_gen_batches``)."""

    def validate(self, group_size: int) -> None:
        del group_size
        if self.pilot_samples < 2:
            raise ConfigError(
                f"allocation.pilot_commit.pilot_samples must be >= 2 (a pilot estimates a "
                f"reward variance), got {self.pilot_samples}"
            )
        if not 0 <= self.kept_pilot_samples <= self.pilot_samples:
            raise ConfigError(
                "allocation.pilot_commit.kept_pilot_samples must be in 0 .. pilot_samples, "
                f"got {self.kept_pilot_samples}"
            )
        if self.pilot_prompts_factor < 1 or self.max_rounds < 1 or self.max_off_iterations < 0:
            raise ConfigError(
                "allocation.pilot_commit: pilot_prompts_factor and max_rounds must be >= 1 and "
                "max_off_iterations >= 0"
            )
        if not 0.0 <= self.too_hard_below <= self.too_easy_above <= 1.0:
            raise ConfigError(
                "allocation.pilot_commit needs 0 <= too_hard_below <= too_easy_above <= 1, got "
                f"{self.too_hard_below} and {self.too_easy_above}"
            )


@dataclass
class SortedGroupsConfig:
    """sGPO (Sudalairaj et al. 2026, "sGPO: Trading Inference FLOPs for Training Efficiency in
    RLVR"): one profiling pass under the initial policy sets each prompt's success rate ``p``;
    solved prompts are dropped, unsolvable ones sub-sampled, each prompt's group size is
    ``1 / p`` within bounds, and prompts are scheduled from easy to hard. Only the paper's
    abstract was available when this was written: every number below is genrl's choice."""

    profile_samples: int = 8
    """Samples per prompt in the profiling pass (their rollouts count in the budget)."""
    profile_prompts: int = 0
    """Training prompts profiled (the first of one shuffled pass); 0: all of them."""
    min_group_size: int = 2
    """Smallest group (a group needs two samples for a baseline)."""
    max_group_size: int = 32
    """Largest group; a prompt never solved in the profile gets this many."""
    unsolvable_keep: float = 0.1
    """Fraction of the never-solved prompts that stay in the schedule."""
    curriculum: Literal["easy_to_hard", "shuffled"] = "easy_to_hard"
    """Prompt order: by profiled success rate, highest first (ties in shuffled order), or
    one shuffled pass."""

    def validate(self, group_size: int) -> None:
        del group_size
        if self.profile_samples < 1 or self.profile_prompts < 0:
            raise ConfigError(
                "allocation.sorted_groups: profile_samples must be >= 1 and profile_prompts >= 0"
            )
        if not 2 <= self.min_group_size <= self.max_group_size:
            raise ConfigError(
                "allocation.sorted_groups needs 2 <= min_group_size <= max_group_size, got "
                f"{self.min_group_size} and {self.max_group_size}"
            )
        if not 0.0 <= self.unsolvable_keep <= 1.0:
            raise ConfigError(
                f"allocation.sorted_groups.unsolvable_keep must be in [0, 1], got "
                f"{self.unsolvable_keep}"
            )


@dataclass
class AdaptiveRolloutsConfig:
    """AR3PO's adaptive rollout (Zhang et al. 2025, arXiv 2509.25808), from its abstract: stages
    of samples until each prompt has a correct one; both numbers are genrl's choices."""

    stage_samples: int = 4
    """Samples per prompt per stage."""
    max_stages: int = 4
    """Stages at most; a prompt gets at most ``stage_samples * max_stages`` samples."""

    def validate(self, group_size: int) -> None:
        del group_size
        if self.stage_samples < 2 or self.max_stages < 1:
            raise ConfigError(
                "allocation.adaptive_rollouts: stage_samples must be >= 2 (a group needs a "
                f"baseline) and max_stages >= 1, got {self.stage_samples}, {self.max_stages}"
            )


@dataclass
class AllocationConfig:
    name: str = "uniform"
    """How an iteration spends its rollout budget: ``uniform`` (every prompt
    ``train.group_size`` samples, GRPO's rule), ``pilot_commit`` or ``sorted_groups`` (sGPO);
    ``genrl/allocation/``. Anything but ``uniform`` runs on one process."""
    metric: str = ""
    """Score the policy reads, e.g. ``countdown/accuracy`` (the papers read a 0/1 accuracy);
    empty: the combined reward."""
    pilot_commit: PilotCommitConfig = field(default_factory=PilotCommitConfig)
    """``allocation.pilot_commit.*``: read when ``name=pilot_commit``."""
    sorted_groups: SortedGroupsConfig = field(default_factory=SortedGroupsConfig)
    """``allocation.sorted_groups.*``: read when ``name=sorted_groups``."""
    adaptive_rollouts: AdaptiveRolloutsConfig = field(default_factory=AdaptiveRolloutsConfig)
    """``allocation.adaptive_rollouts.*``: read when ``name=adaptive_rollouts``."""

    def validate(self, group_size: int) -> None:
        from genrl.allocation.registry import ALLOCATIONS

        if self.name not in ALLOCATIONS:
            from genrl.config.errors import unknown_message

            raise ConfigError(
                unknown_message(self.name, list(ALLOCATIONS), "allocation.name", value=True)
            )
        section = getattr(self, self.name, None)
        if section is not None:
            section.validate(group_size)


def validate_allocation(config: Any, num_processes: int) -> None:
    """Raise ``ConfigError`` for an allocation the run cannot use (``TrainConfig.validate``)."""
    from genrl.algorithms import ALGORITHMS

    config.allocation.validate(config.train.group_size)
    name = config.allocation.name
    if name == "uniform":
        return
    t = config.train
    algorithm = ALGORITHMS.get(config.algorithm.name)
    if algorithm is not None and (
        algorithm.group_units or algorithm.fixed_group_shape or not algorithm.needs_groups
    ):
        raise ConfigError(
            f"allocation.name={name} sizes groups of its own; {config.algorithm.name} trains on "
            "whole groups of train.group_size (or on no groups) and cannot use it"
        )
    for key, clash in {
        "train.dynamic_sampling": t.dynamic_sampling,
        "train.offline_store": bool(t.offline_store),
        "train.max_staleness": bool(t.max_staleness),
        "train.overlap_rewards": t.overlap_rewards,
    }.items():
        if clash:
            raise ConfigError(f"allocation.name={name} samples its own rounds; unset {key}")
    if num_processes > 1:
        raise ConfigError(
            f"allocation.name={name} runs on one process (its groups have sizes of their own "
            f"and are not split over processes); this run has {num_processes}"
        )


__all__ = [
    "AdaptiveRolloutsConfig",
    "AllocationConfig",
    "PilotCommitConfig",
    "SortedGroupsConfig",
    "validate_allocation",
]
