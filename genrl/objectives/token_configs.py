"""The token objectives' configs, without torch: the GRPO family's fields (``tokens.py``) and
the masked-diffusion LMs' corrupted views (``masked_tokens.py``), with the names they validate
against.

They live apart from the objectives, which import them, so that the command line builds and
checks a whole config before it imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from genrl.config.errors import ConfigError
from genrl.objectives.flow_configs import validate_median_groups
from samplers.masked_schedule import unmasking_schedule

if TYPE_CHECKING:
    from genrl.objectives.dllm_estimators import LikelihoodEstimator

AGGREGATIONS: tuple[str, ...] = ("sequence_mean", "token_mean", "bnpo", "sequence_sum", "constant")

# The registered likelihood estimators (``dllm_estimators.ESTIMATORS``, whose classes need torch);
# tests/test_masked_lm.py keeps the two equal.
ESTIMATOR_NAMES: tuple[str, ...] = ("maskgrpo", "d1", "random_ratio", "trace")


@dataclass
class TokenPolicyGradientConfig:
    """Fields of the token objectives, with GRPO's defaults (TRL's where the paper is silent)."""

    clip_range: float = 0.2
    """PPO epsilon, low side (and high side unless set); GRPO 0.2, GSPO 3e-4."""
    clip_range_high: float | None = None
    """Upper epsilon (DAPO clip-higher: 0.28; GSPO: 4e-4); None = ``clip_range``."""
    aggregation: Literal["sequence_mean", "token_mean", "bnpo", "sequence_sum", "constant"] = (
        "sequence_mean"
    )
    """Loss reduction over tokens (``genrl.objectives.losses.aggregate``): per-sequence mean (GRPO, TRL
    ``grpo``); token mean over the optimizer step's tokens on all processes (DAPO, TRL ``dapo``);
    token mean per minibatch (TRL ``bnpo``); mean of per-sequence token sums (verl
    ``seq-mean-token-sum``); token sum / (B * max_new_tokens) (Dr.GRPO)."""
    advantage: Literal["group", "rloo", "median", "mssr"] = "group"
    """``group``: z-score within the group (std per ``std_mode``); ``rloo``: leave-one-out;
    ``median``: MC-GRPO (Kim 2026): groups of ``G + 1`` (an odd ``train.group_size``) centred on
    their median and scaled by its absolute deviation, the median sample left out of training
    (``genrl.objectives.advantages.median_centered_advantages``); ``mssr``: MSSR (Liu et al. 2025, arXiv
    2512.18215), one rollout per prompt (``train.group_size=1``, ``algorithm.name=grpo`` only):
    reward minus the prompt's tracked Beta baseline, normalised over the batch, plus a per-token
    entropy bonus (the ``mssr_*`` fields; ``std_mode``, ``std_estimator`` and ``std_eps`` are
    unused)."""
    std_mode: Literal["group", "global", "none"] = "group"
    """Divide by the group's reward std (GRPO), the batch's (``global``) or nothing (Dr.GRPO)."""
    std_estimator: Literal["sample", "population"] = "sample"
    """Std of the normaliser: Bessel's, as TRL and verl (``torch.std``), or the population's."""
    std_eps: float = 1e-4
    """Added to the std (TRL: 1e-4; verl: 1e-6)."""
    kl_beta: float = 0.0
    """Weight of the KL to the reference (DeepSeekMath 0.04; TRL and DAPO 0). 0 skips the
    reference forward entirely."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator (Schulman's k3 is GRPO's); the KL term is reduced with
    ``aggregation``, as in TRL and verl."""
    clip_ratio_c: float | None = None
    """Dual-clip bound (> 1) on the ratio of negative-advantage tokens (verl's ``clip_ratio_c``,
    3 there); None (TRL) disables it."""
    advantage_clip: float | None = None
    """Clamp advantages to +-this; None disables."""
    mad_eps: float = 1e-3
    """``advantage=median``: added to the median absolute deviation (MC-GRPO: 1e-3)."""
    mssr_rho: float = 0.9175
    """``advantage=mssr``: forgetting factor of the Beta baseline's update (``alpha <- rho alpha
    + o``). The released code (ruiiu/MSSR) adapts it between ``rho_min=0.875`` and
    ``rho_max=0.96`` from the KL to the reference and uses their midpoint 0.9175 without one;
    genrl keeps it fixed."""
    mssr_prior_count: float = 8.0
    """``advantage=mssr``: pseudo-outcomes ``N0`` of an unseen prompt's prior (released code:
    ``1 / (1 - rho_min) = 8``)."""
    mssr_v_init: float = 0.5
    """``advantage=mssr``: prior success probability of an unseen prompt (released code's
    ``mvsr_v_init``: 0.5)."""
    mssr_eps: float = 1e-6
    """``advantage=mssr``: floor of the batch variance that normalises advantages (released
    code's ``mvsr_eps``: 1e-6)."""
    mssr_entropy_alpha: float = 0.4
    """``advantage=mssr``: scale of the entropy bonus ``min(alpha H, |A| / kappa)`` (released
    MSSR config ``entropy_alpha``: 0.4, Cheng et al. 2025's value); 0 turns the shaping off,
    which is the paper's unstabilised single-rollout baseline (MVSR)."""
    mssr_entropy_kappa: float = 2.0
    """``advantage=mssr``: the bonus is at most ``|A| / kappa`` (released: ``entropy_kappa`` 2)."""
    tis_cap: float | None = None
    """Truncated importance sampling (Yao et al. 2025): weight each token's surrogate term by
    ``min(pi_old / mu, tis_cap)``, ``mu`` the rollout engine's sampling probability and
    ``pi_old`` training's recomputation (``genrl/objectives/mismatch.py``; verl's rollout
    correction uses 2). None: no correction; the mismatch is logged either way
    (``loss/mismatch_*``)."""
    mssr_entropy: Literal["full", "sampled"] = "full"
    """``advantage=mssr``: the per-token entropy ``H``: ``full``, the entropy of the whole
    sampling distribution ``-sum_v p_v log p_v`` (the definition the released code's docstring
    states), from the old-log-prob forward; ``sampled``, ``-p log p`` of the sampled token only,
    which is what the released code computes (``compute_token_entropy``)."""

    @property
    def group_free(self) -> bool:
        """Whether advantages need no group (MSSR's tracked baseline), so that
        ``train.group_size=1`` is allowed."""
        return self.advantage == "mssr"

    def validate_objective(self, train_config: Any = None, mssr: bool = False) -> None:
        """Raise ``ConfigError`` on a bad field; ``mssr``: whether this objective implements
        ``advantage=mssr`` (the causal LM's, which has the entropies the shaping needs)."""
        if self.advantage == "mssr":
            self._validate_mssr(train_config, mssr)
        if self.clip_range <= 0 or (self.clip_range_high is not None and self.clip_range_high <= 0):
            raise ConfigError("algorithm.clip_range and clip_range_high must be positive")
        if self.kl_beta < 0:
            raise ConfigError(f"algorithm.kl_beta must be >= 0, got {self.kl_beta}")
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(f"algorithm.aggregation must be one of {AGGREGATIONS}")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ConfigError(f"algorithm.clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if self.std_eps < 0:
            raise ConfigError(f"algorithm.std_eps must be >= 0, got {self.std_eps}")
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ConfigError(f"algorithm.tis_cap must be > 0 (or null), got {self.tis_cap}")
        if train_config is not None:
            if train_config.generation.temperature <= 0:
                raise ConfigError(
                    "generation.temperature must be > 0: greedy rollouts give every member of a "
                    "group the same answer, hence zero advantages"
                )
            if self.advantage != "mssr" and train_config.train.group_size < 2:
                raise ConfigError("train.group_size must be >= 2: advantages compare a group")
            validate_median_groups(self.advantage, train_config.train.group_size)

    def _validate_mssr(self, train_config: Any, supported: bool) -> None:
        if not supported:
            raise ConfigError(
                "algorithm.advantage=mssr is implemented for algorithm.name=grpo (causal LMs) only"
            )
        if not 0 < self.mssr_rho <= 1:
            raise ConfigError(f"algorithm.mssr_rho must be in (0, 1], got {self.mssr_rho}")
        if self.mssr_prior_count <= 0:
            raise ConfigError(
                f"algorithm.mssr_prior_count must be > 0, got {self.mssr_prior_count}"
            )
        if not 0 <= self.mssr_v_init <= 1:
            raise ConfigError(f"algorithm.mssr_v_init must be in [0, 1], got {self.mssr_v_init}")
        if self.mssr_eps < 0 or self.mssr_entropy_alpha < 0:
            raise ConfigError("algorithm.mssr_eps and mssr_entropy_alpha must be >= 0")
        if self.mssr_entropy_kappa <= 0:
            raise ConfigError(
                f"algorithm.mssr_entropy_kappa must be > 0, got {self.mssr_entropy_kappa}"
            )
        if self.mssr_entropy not in ("full", "sampled"):
            raise ConfigError(
                f"algorithm.mssr_entropy must be full or sampled, got {self.mssr_entropy!r}"
            )
        if train_config is None:
            return
        if train_config.train.group_size != 1:
            raise ConfigError(
                "algorithm.advantage=mssr is single-rollout: set train.group_size=1 (and spend "
                "the samples on more train.prompts_per_iteration); got "
                f"{train_config.train.group_size}"
            )
        if train_config.train.dynamic_sampling:
            raise ConfigError(
                "train.dynamic_sampling drops groups with one reward value, i.e. every group of "
                "one sample: it cannot be used with algorithm.advantage=mssr"
            )
        if train_config.reward_aggregation != "weighted_sum":
            raise ConfigError(
                "algorithm.advantage=mssr needs reward_aggregation=weighted_sum: "
                "normalize_then_sum normalises within groups, and groups here hold one sample"
            )


@dataclass
class MaskedViewsConfig:
    """Fields choosing the corrupted views a masked-diffusion LM's tokens are scored under."""

    estimator: Literal["maskgrpo", "d1", "random_ratio", "trace"] = "maskgrpo"
    """Likelihood estimator (``genrl/objectives/dllm_estimators.py``)."""
    num_iterations: int = 12
    """Corrupted views per rollout sample (MaskGRPO's and d1's inner iterations, mu: 12 in both
    released recipes). The ``trace`` estimator is deterministic and uses one per sampling step."""
    mask_ratio_floor: float = 0.6
    """MaskGRPO: first mask ratio ``m`` of ``t_j = m + (1 - m)(j + 1)/mu`` (text: 0.6; the
    released image scripts use 0.6 and, with a reward server, 0.8)."""
    view_masking: Literal["fading", "uniform"] = "fading"
    """MaskGRPO's views: ``fading``, the text setting (later tokens masked more often, the
    released ``remask_ar``); ``uniform``, the image setting (every image token masked with
    probability ``t_j``, the released ``remask_t2i``)."""
    post_eos: Literal["count", "exclude"] = "count"
    """MaskGRPO's views: ``count`` masks and scores completion positions after the end token
    like any other, as the released code does (its loss mask is the re-masking mask), so a view
    does not reveal where the answer ends; ``exclude`` never masks or counts them."""
    prompt_mask_prob: float = 0.15
    """d1: probability of masking each prompt token."""

    def validate_views(self, train_config: Any = None) -> None:
        if self.estimator not in ESTIMATOR_NAMES:
            raise ConfigError(f"algorithm.estimator must be one of {sorted(ESTIMATOR_NAMES)}")
        if self.num_iterations < 1:
            raise ConfigError("algorithm.num_iterations must be >= 1")
        if self.view_masking not in ("fading", "uniform"):
            raise ConfigError("algorithm.view_masking must be 'fading' or 'uniform'")
        if train_config is not None and train_config.generation.sampler == "llada":
            g = train_config.generation
            unmasking_schedule(
                g.diffusion_steps or g.max_new_tokens, g.block_length, g.max_new_tokens
            )

    def make_estimator(self) -> LikelihoodEstimator:
        # Imported here: the estimators are tensor math, and this module is read before torch.
        from genrl.objectives.dllm_estimators import ESTIMATORS

        options: dict[str, Any] = {
            "maskgrpo": {
                "ratio_floor": self.mask_ratio_floor,
                "count_tail": self.post_eos == "count",
                "fading": self.view_masking == "fading",
            },
            "d1": {"prompt_mask_prob": self.prompt_mask_prob},
        }.get(self.estimator, {})
        return ESTIMATORS[self.estimator](**options)
