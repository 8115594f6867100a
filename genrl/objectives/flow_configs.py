"""The flow policy-gradient objectives' configs, without torch: the flow-step loss's fields
(``flow_steps.py``), Flow-GRPO's (``flow_policy_gradient.py``) and BranchGRPO's
(``tree_policy_gradient.py``), with the names and pure checks they validate against.

They live apart from the objectives, which import them, so that the command line builds and
checks a whole config before it imports torch (``genrl/rollouts/configs.py`` says the same of
the rollouts' sections).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from genrl.config.errors import ConfigError

Fusion = Literal["mean", "probability", "path_probability"]
FUSIONS: tuple[str, ...] = ("mean", "probability", "path_probability")

WidthPruning = Literal[
    "none", "last_split_top", "last_split_best_worst", "sibling_top", "best_worst_paths"
]
WIDTH_PRUNING: tuple[str, ...] = (
    "none",
    "last_split_top",
    "last_split_best_worst",
    "sibling_top",
    "best_worst_paths",
)


def pruned_depths(
    depth_pruning: list[int],
    slide_every: int,
    stop_depth: int,
    iteration: int,
) -> list[int]:
    """The pruned child depths at ``iteration``: ``depth_pruning`` moved one depth shallower every
    ``slide_every`` iterations (0: fixed), never shallower than ``stop_depth`` for its first
    depth (the reference's ``--depth_pruning_slide`` / ``_interval`` / ``_stop_depth``)."""
    window = sorted(depth_pruning)
    if not window or not slide_every:
        return window
    shift = min(iteration // slide_every, max(0, window[0] - stop_depth))
    return [d - shift for d in window]


def validate_median_groups(advantage: str, group_size: int) -> None:
    """MC-GRPO needs groups of odd size ``G + 1``, so that the median is one sample's reward."""
    if advantage == "median" and group_size % 2 == 0:
        raise ConfigError(
            "algorithm.advantage=median (MC-GRPO) needs an odd train.group_size (G + 1 samples "
            f"per prompt, so that the median is one sample's reward), got {group_size}"
        )


@dataclass
class FlowStepLossConfig:
    """Fields of the flow-step loss (every flow policy-gradient algorithm documents its
    defaults)."""

    clip_range: float = 1e-4
    """PPO clip range epsilon (low side, and high side unless set); Flow-GRPO: 1e-4 with
    mean-reduced log-probs (1e-5 for Flow-GRPO-Fast)."""
    clip_range_high: float | None = None
    """Separate upper clip range (DAPO clip-higher); None = ``clip_range``."""
    clip_ratio_c: float | None = None
    """Dual-clip bound (> 1) on the ratio of negative-advantage transitions (verl's
    ``clip_ratio_c``, 3 there); None (Flow-GRPO) disables it."""
    kl_beta: float = 0.04
    """Weight of the KL to the reference on the step means; 0 skips the reference forward.
    Flow-GRPO uses 0.04 (GenEval/OCR), 0.01 (PickScore), 0 (Fast); with ``kl_form=flow_grpo``
    its values carry over as they are."""
    kl_form: Literal["flow_grpo", "exact"] = "flow_grpo"
    """``flow_grpo``: ``mean((mu - mu_ref)^2) / (2 std_dev_t^2)`` with the sampler reference's
    ``std_dev_t`` (for the Flow-GRPO SDE the diffusion coefficient, without ``sqrt(-dt)``), as
    its ``train_sd3.py`` computes it: the exact KL times the step's ``|dt|``. ``exact``: the
    KL between the two Gaussian transitions, larger by ``1 / |dt|`` (4 to 28 across the 10-step
    shift-3 schedule), so the same ``kl_beta`` is stronger and weighs late steps more."""
    ratio_norm: bool = False
    """GRPO-Guard (Wang et al. 2025, arXiv 2510.22319; released in Flow-GRPO's
    ``train_sd3_GRPO_Guard.py``): the log-ratio becomes ``s * (log_ratio + mean((mu -
    mu_old)^2) / (2 s^2))`` with ``s`` the transition std, which removes the negative bias of the
    ratio and equalises its spread across steps, and each transition's policy loss is divided by
    its ``|dt|``. The released configs pair it with clip ranges of 2e-6 (4e-6 for PickScore)."""
    advantage_clip: float | None = 5.0
    """Clamp advantages to +-this (Flow-GRPO: 5)."""
    cfg_in_training: bool = True
    """With ``sampler.guidance_scale > 1``, recompute log-probs with CFG (cond and uncond in one
    batched forward), as Flow-GRPO does; False trains the conditional velocity. Whether the
    unconditional branch gets gradients is the diffusers adapters' ``detach_uncond`` option
    (Flow-GRPO trains both since its commit a482878; the SD3 recipes set it off)."""

    def validate_loss(self, train_config: Any = None) -> None:
        """Raise ``ConfigError`` naming the ``algorithm.*`` field that cannot work."""
        if self.clip_range <= 0:
            raise ConfigError(f"algorithm.clip_range must be positive, got {self.clip_range}")
        if self.clip_range_high is not None and self.clip_range_high <= 0:
            raise ConfigError(
                f"algorithm.clip_range_high must be positive, got {self.clip_range_high}"
            )
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ConfigError(f"algorithm.clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.kl_beta < 0:
            raise ConfigError(f"algorithm.kl_beta must be >= 0, got {self.kl_beta}")
        if train_config is None:
            return
        sampler = train_config.sampler
        if sampler.noise_level <= 0:
            raise ConfigError(
                f"sampler.noise_level must be > 0 for {train_config.algorithm.name}: a "
                "deterministic step has no log-prob to train (use `genrl eval` to sample with "
                "the ODE)"
            )
        if sampler.guidance_scale != 1 and not self.cfg_in_training:
            raise ConfigError(
                "algorithm.cfg_in_training=false needs sampler.guidance_scale=1: rollout "
                "log-probs come from the guided velocity, so training without CFG would be "
                "off-policy from the first step"
            )
        if self.ratio_norm and sampler.log_prob_reduction != "mean":
            raise ConfigError(
                "algorithm.ratio_norm (GRPO-Guard) normalises mean-reduced log-probs: set "
                "sampler.log_prob_reduction=mean"
            )


@dataclass
class FlowPolicyGradientConfig(FlowStepLossConfig):
    """Fields of Flow-GRPO's objective (besides the step loss's)."""

    kl_reward: float = 0.0
    """Flow-GRPO's ``kl_reward``: every step's reward becomes the final reward minus this times
    that step's KL to the reference, measured while sampling (one more forward per step), and
    advantages are normalised step by step; 0 disables it."""
    drop_zero_advantages: bool = True
    """Leave trajectories whose advantages are all zero out of training, as Flow-GRPO does
    (``train_sd3.py``); a few of them come back at random when too few remain to fill the
    iteration's minibatches."""
    timestep_fraction: float = 0.99
    """Fraction of the sampling steps trained per trajectory (Flow-GRPO: 0.99 -> 9 of 10);
    with an SDE window (``sampler.sde_window_size``) every window step is trained."""
    timestep_selection: Literal["prefix", "random"] = "prefix"
    """Which steps: the first ones in sampling order (the Flow-GRPO reference trains steps
    0..k-1) or a random subset per trajectory (DanceGRPO-style)."""
    std_mode: Literal["group", "global", "none"] = "global"
    """Advantage normaliser: per-prompt std, std of the whole gathered batch (Flow-GRPO's SD3
    configs, ``global_std``) or none."""
    std_estimator: Literal["sample", "population"] = "population"
    """Std of the normaliser: Flow-GRPO's ``np.std`` (population) or Bessel's (sample)."""
    std_eps: float = 1e-4
    """Added to the std (Flow-GRPO: 1e-4)."""
    stat_history: int = 1
    """Iterations of per-prompt rewards pooled in the baseline (1 = current batch only)."""
    advantage: Literal["group", "median"] = "group"
    """``group``: the per-prompt normalisation above; ``median``: MC-GRPO (Kim 2026): groups
    of ``G + 1`` (an odd ``train.group_size``) centred on their median and scaled by its
    absolute deviation, the median sample left out of training
    (``genrl.objectives.advantages.median_centered_advantages``)."""
    mad_eps: float = 1e-3
    """``advantage=median``: added to the median absolute deviation (MC-GRPO: 1e-3)."""

    def validate_objective(self, train_config: Any = None) -> None:
        if not 0 < self.timestep_fraction <= 1:
            raise ConfigError(
                f"algorithm.timestep_fraction must lie in (0, 1], got {self.timestep_fraction}"
            )
        if self.stat_history < 1:
            raise ConfigError(f"algorithm.stat_history must be >= 1, got {self.stat_history}")
        if self.kl_reward < 0:
            raise ConfigError(f"algorithm.kl_reward must be >= 0, got {self.kl_reward}")
        if self.kl_reward > 0 and self.stat_history > 1:
            raise ConfigError(
                "algorithm.kl_reward gives one reward per step, which cannot be pooled over "
                "iterations: set algorithm.stat_history=1"
            )
        if self.std_eps < 0:
            raise ConfigError(f"algorithm.std_eps must be >= 0, got {self.std_eps}")
        if self.advantage == "median" and (self.kl_reward > 0 or self.stat_history > 1):
            raise ConfigError(
                "algorithm.advantage=median centres each group of this iteration on its own "
                "median: set algorithm.kl_reward=0 and algorithm.stat_history=1"
            )
        if train_config is not None:
            validate_median_groups(self.advantage, train_config.train.group_size)


@dataclass
class TreePolicyGradientConfig(FlowStepLossConfig):
    """Fields of BranchGRPO's objective (besides the step loss's)."""

    fusion: Literal["mean", "probability", "path_probability"] = "mean"
    """Node values from the leaves: their mean; the reference's probability weighting (at each
    split node, a softmax over its children's edge log-probs, level by level); or the mean
    weighted by each leaf's whole path probability below the node (an earlier genrl variant)."""
    train_steps: list[int] | None = None
    """Steps whose edges are trained; None = every stochastic step (the paper's method and the
    reference's README)."""
    depth_pruning: list[int] = field(default_factory=list)
    """Child depths left out of training, as the reference's ``--depth_pruning``: the edges of
    sampling step ``t`` enter depth ``t + 1`` (e.g. ``[15, 16, 17]`` of 20 steps)."""
    depth_pruning_slide_every: int = 0
    """Slide the pruned depths one depth shallower every this many iterations (0: fixed), until
    the first reaches ``depth_pruning_stop``. The LR schedule is planned with the first
    iteration's number of trained edges."""
    depth_pruning_stop: int | None = None
    """Shallowest depth the sliding window may reach; None = the last split step (the
    reference's default ``max(split_points)``)."""
    width_pruning: WidthPruning = "none"
    """``last_split_top`` and ``last_split_best_worst``: the reference's modes 1 and 2 on the
    transitions after the last split; ``sibling_top`` and ``best_worst_paths``: genrl's own
    (``genrl/objectives/tree_pruning.py``)."""
    width_keep: float = 0.5
    """Kept fraction of width pruning (the reference's ``--width_pruning_ratio``, 0.5)."""
    pruning_fraction: float = 1.0
    """Prune during the first this fraction of ``train.iterations`` only (the reference's
    ``--pruning_step_ratio``; 1 = always)."""
    depth_eps: float = 1e-8
    """Added to each depth's std (the reference: 1e-8)."""
    depth_min_std: float = 1e-6
    """A depth whose std is below this gets advantage 0 (the reference: 1e-6)."""
    depth_std_estimator: Literal["sample", "population"] = "sample"
    """Std of each depth's node values (the reference: ``torch.std``, Bessel)."""
    kl_beta: float = 0.0
    """KL weight on the step means; the reference has no KL term."""

    def validate_objective(self, split_steps: list[int], num_steps: int | None) -> None:
        if not 0 < self.width_keep <= 1:
            raise ConfigError(f"algorithm.width_keep must lie in (0, 1], got {self.width_keep}")
        if not 0 <= self.pruning_fraction <= 1:
            raise ConfigError(
                f"algorithm.pruning_fraction must lie in [0, 1], got {self.pruning_fraction}"
            )
        if self.fusion not in FUSIONS or self.width_pruning not in WIDTH_PRUNING:
            raise ConfigError(
                f"algorithm.fusion must be one of {FUSIONS}, width_pruning one of {WIDTH_PRUNING}"
            )
        if self.width_pruning.startswith("last_split") and not split_steps:
            raise ConfigError(f"algorithm.width_pruning={self.width_pruning} needs a split step")
        if self.depth_eps < 0 or self.depth_min_std < 0:
            raise ConfigError("algorithm.depth_eps and depth_min_std must be >= 0")
        if self.depth_pruning_slide_every < 0:
            raise ConfigError("algorithm.depth_pruning_slide_every must be >= 0")
        if num_steps is None:
            return
        bad = [d for d in self.depth_pruning if not 1 <= d <= num_steps]
        if bad:
            raise ConfigError(
                f"algorithm.depth_pruning {bad}: child depths lie in [1, {num_steps}] (the "
                "edges of step t enter depth t + 1)"
            )

    def trained_steps(
        self,
        num_steps: int,
        split_steps: list[int],
        ode_steps: list[int],
        iteration: int = 0,
        iterations: int = 0,
    ) -> list[int]:
        """The steps trained at ``iteration`` of ``iterations``: ``train_steps`` (or all) minus ODE
        steps and, while pruning applies, the steps entering a pruned depth."""
        steps = range(num_steps) if self.train_steps is None else self.train_steps
        bad = [s for s in steps if not 0 <= s < num_steps]
        if bad:
            raise ConfigError(f"algorithm.train_steps {bad} outside [0, {num_steps})")
        pruned: set[int] = set()
        if self.prunes_at(iteration, iterations):
            stop = self.depth_pruning_stop
            if stop is None:
                stop = max(split_steps) if split_steps else 0
            window = pruned_depths(
                self.depth_pruning, self.depth_pruning_slide_every, stop, iteration
            )
            pruned = set(window)
        return sorted(s for s in steps if s not in ode_steps and s + 1 not in pruned)

    def prunes_at(self, iteration: int, iterations: int) -> bool:
        """Whether pruning applies at ``iteration`` (the reference prunes while
        ``step <= int(max_steps * pruning_step_ratio)``)."""
        return iterations == 0 or iteration <= int(iterations * self.pruning_fraction)
