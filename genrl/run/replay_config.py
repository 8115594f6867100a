"""``replay.*``: the replay store of earlier completions (``genrl/loop/replay.py``), without torch.

Two uses of one store, which may be combined:

- ExGRPO (Zhan et al. 2025, arXiv 2510.02245; released code ``ElliottYan/LUFFY``, folder
  ``ExGRPO``): ``replay.ratio > 0`` replaces that fraction of an iteration's prompts by
  questions drawn from the store, bucketed by how many of their rollouts were correct; each
  such group is one stored correct completion (the lowest-entropy one) and ``G - 1`` fresh ones.
- AR3PO's response reuse (Zhang et al. 2025, arXiv 2509.25808): ``replay.reuse_correct``: a
  group whose fresh completions are all wrong gets one of the prompt's stored correct
  completions in place of one of them.

The defaults are ExGRPO's released settings (``exp_scripts/run_exgrpo.sh`` and
``mix_ppo_trainer.yaml``) where it has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from genrl.config.errors import ConfigError
from genrl.rollouts.configs import GenerationConfig

BUCKET_WEIGHTINGS = ("normal", "linear", "sqrt", "linear_clip")


@dataclass
class ReplayConfig:
    """Fields of the replay store; with ``ratio=0`` and ``reuse_correct=false`` there is none."""

    ratio: float = 0.0
    """ExGRPO's experience ratio: the fraction of ``train.prompts_per_iteration`` whose groups
    replay a stored question (``int(P * ratio)`` of them, fewer while the store holds fewer
    questions; the released script uses 0.5). 0: no ExGRPO mixing."""
    reuse_correct: bool = False
    """AR3PO's response reuse: a group whose fresh completions are all wrong gets one stored
    correct completion of its prompt in place of its last fresh one (when the store has one)."""
    reuse_choice: Literal["latest", "random"] = "latest"
    """Which stored correct completion AR3PO's reuse takes: the most recently stored, or one
    drawn uniformly (``random``)."""
    bucket_weighting: Literal["normal", "linear", "sqrt", "linear_clip"] = "normal"
    """ExGRPO's weight of the bucket of questions with ``k`` correct rollouts out of ``G``
    (``WeightedBucketSampler``): ``normal`` the density of N(G/2, 1) at ``k`` (the released
    script's ``exp_bucket_manager=normal``), ``linear`` k/G, ``sqrt`` sqrt(k/G),
    ``linear_clip`` k/G up to G/2 and 0.5 beyond."""
    trajectory_choice: Literal["lowest_entropy", "highest_entropy", "random"] = "lowest_entropy"
    """ExGRPO: which stored completion of a replayed question is replayed: the one of lowest
    mean token entropy (the released ``exp_metric=ent``, ``exp_select_mode=argmin``), the
    highest, or one drawn uniformly (``exp_metric=random``)."""
    entropy: Literal["current", "recorded"] = "current"
    """The entropy ``trajectory_choice`` ranks by: ``current``, the mean over the completion's
    tokens of the full-vocabulary entropy under the policy about to sample (the released code
    scores every stored completion of the chosen questions this way before each rollout);
    ``recorded``, the mean negative sampled-token log-prob at sampling time (a one-sample
    estimate of the same entropy, free: no forward)."""
    start_accuracy: float | None = 0.35
    """ExGRPO's delayed start (``experience_start_sratio``): the store collects and replays only
    after the first iteration whose fraction of correct completions exceeds this; None: from
    the first iteration."""
    min_correct: int = 1
    """A question's correct completions are stored only when at least this many of its group's
    ``G`` are correct (the released ``experience_lbound=0`` with its strict ``>``: 1)."""
    max_correct: int | None = None
    """... and at most this many (the released ``experience_rbound=7`` of 8); None: ``G - 1``;
    values above ``G`` mean ``G`` (store completions of wholly correct groups too)."""
    retire_solved: bool = True
    """ExGRPO: a question whose whole group is correct leaves the store for good (the released
    ``skip_uid_set``; there it also leaves the training prompts, which genrl keeps drawing)."""
    success_score: str = ""
    """The score that says a completion is correct; empty: the run's training reward."""
    success_threshold: float = 1.0
    """Correct means ``score >= success_threshold`` (the released code's ``reward ==
    success_value`` with its success value 1)."""

    @property
    def enabled(self) -> bool:
        return self.ratio > 0 or self.reuse_correct

    def validate(self, train_config: Any) -> None:
        """Raise ``ConfigError`` on a bad field or a run the store cannot serve."""
        if not 0 <= self.ratio <= 1:
            raise ConfigError(f"replay.ratio must be in [0, 1], got {self.ratio}")
        if self.bucket_weighting not in BUCKET_WEIGHTINGS:
            raise ConfigError(f"replay.bucket_weighting must be one of {BUCKET_WEIGHTINGS}")
        if self.trajectory_choice not in ("lowest_entropy", "highest_entropy", "random"):
            raise ConfigError(
                "replay.trajectory_choice must be lowest_entropy, highest_entropy or random"
            )
        if self.entropy not in ("current", "recorded"):
            raise ConfigError(f"replay.entropy must be current or recorded, got {self.entropy!r}")
        if self.reuse_choice not in ("latest", "random"):
            raise ConfigError(
                f"replay.reuse_choice must be latest or random, got {self.reuse_choice!r}"
            )
        if not self.enabled:
            return
        upper = self.upper_correct(train_config.train.group_size)
        if not 1 <= self.min_correct <= upper:
            raise ConfigError(
                f"replay.min_correct ({self.min_correct}) and max_correct ({upper}) must satisfy "
                "1 <= min_correct <= max_correct"
            )
        if not isinstance(train_config.generation, GenerationConfig):
            # The store rebuilds completions as the autoregressive rollout records them, and
            # that rollout is the one whose section is GenerationConfig.
            raise ConfigError(
                f"replay.*: the replay store holds causal-LM completions; algorithm.name="
                f"{train_config.algorithm.name} does not sample them (grpo and exgrpo do)"
            )
        t = train_config.train
        for key, clash in {
            "train.dynamic_sampling": t.dynamic_sampling,
            "train.offline_store": bool(t.offline_store),
            "train.max_staleness": bool(t.max_staleness),
            "train.overlap_rewards": t.overlap_rewards,
            "allocation.name": train_config.allocation.name != "uniform",
        }.items():
            if clash:
                raise ConfigError(
                    f"replay.* makes its own rounds; it cannot be combined with {key}"
                )

    def upper_correct(self, group_size: int) -> int:
        """The largest stored count of correct completions in a group of ``group_size``."""
        if self.max_correct is None:
            return group_size - 1
        return min(self.max_correct, group_size)


__all__ = ["BUCKET_WEIGHTINGS", "ReplayConfig"]
