"""The config checks of the run's sampling modes (asynchronous rollouts, replay, the offline
store), kept apart from ``config.py`` so that each file reads in one sitting."""

from __future__ import annotations

from typing import Any

from genrl.config.errors import ConfigError


def validate_sampling_modes(config: Any, num_processes: int) -> None:
    """Raise ``ConfigError`` for ``train.max_staleness`` and ``replay.*`` settings that cannot
    work (``TrainConfig.validate``)."""
    t = config.train
    if t.max_staleness < 0:
        raise ConfigError(f"train.max_staleness must be >= 0, got {t.max_staleness}")
    if t.max_staleness:
        for key, clash in {
            "train.dynamic_sampling": t.dynamic_sampling,
            "train.offline_store": bool(t.offline_store),
            "train.overlap_rewards": t.overlap_rewards,
        }.items():
            if clash:
                raise ConfigError(
                    f"train.max_staleness samples ahead one round per iteration; it cannot "
                    f"be combined with {key}"
                )
        if num_processes > 1:
            raise ConfigError(
                f"train.max_staleness runs its sampling thread on one process; this run "
                f"has {num_processes} (a collective in the sampling thread would interleave "
                "with the update's)"
            )
    config.replay.validate(config)
    if config.replay.enabled and num_processes > 1:
        raise ConfigError(f"replay.* keeps its store on one process; this run has {num_processes}")


def validate_offline(config: Any, num_processes: int) -> None:
    """Raise ``ConfigError`` for offline settings that cannot work (``TrainConfig.validate``)."""
    from genrl.algorithms import ALGORITHMS
    from genrl.config.errors import ConfigError

    t = config.train
    if not t.offline_store:
        raise ConfigError("train.offline_groups needs train.offline_store (a directory)")
    if not ALGORITHMS[config.algorithm.name].supports_offline:
        offline = [n for n, c in ALGORITHMS.items() if c.supports_offline]
        raise ConfigError(
            f"algorithm {config.algorithm.name!r} trains on its own rollouts and cannot read "
            f"an offline store; algorithms that can: {', '.join(offline)}"
        )
    if t.offline_groups < 0:
        raise ConfigError(f"train.offline_groups must be >= 0, got {t.offline_groups}")
    if t.dynamic_sampling:
        raise ConfigError("train.dynamic_sampling samples anew; it cannot read a store")
    if t.prompts_per_iteration % num_processes:
        raise ConfigError(
            f"an offline store is filled and read in whole groups per process: "
            f"train.prompts_per_iteration ({t.prompts_per_iteration}) must be divisible by "
            f"the number of processes ({num_processes})"
        )


__all__ = ["validate_offline", "validate_sampling_modes"]
