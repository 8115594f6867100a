"""The regression objectives' configs, without torch: the noisings' fields (``regression.py``)
and those of RAM, GDRO, DiffusionNFT (``regression_objectives.py``), AWM
(``advantage_weighted_matching.py``) and DGPO (``group_preference.py``).

They live apart from the objectives, which import them, so that the command line builds and
checks a whole config before it imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from genrl.config.errors import ConfigError

Weighting = Literal["uniform", "t", "ghuber"]


@dataclass
class NoisingConfig:
    """Fields of the noisings (each regression algorithm documents its defaults)."""

    noisings_per_sample: int = 4
    """Draws of ``(t, eps)`` per clean sample (RAM's K); each is one training unit (one unit
    per group and draw for group losses)."""
    time_sampling: Literal["uniform", "linear", "logit_normal", "sampler_steps"] = "uniform"
    """Density of ``t`` on ``(time_min, time_max)``: uniform; ``linear``, density proportional to
    ``t`` (more weight near noise; RAM); ``logit_normal``, ``sigmoid(N(0, 1))`` (SD3's
    pretraining); ``sampler_steps``, uniform over the sampler's noise levels ``sigma_0 ..
    sigma_{T-1}`` (DiffusionNFT's released code; the range is ignored)."""
    time_min: float = 0.02
    """Smallest ``t``: at ``t -> 0`` the state is the clean sample and the regression is
    ill-conditioned for ``x_0``-space losses."""
    time_max: float = 0.98
    """Largest ``t``."""

    def validate_noising(self) -> None:
        if self.noisings_per_sample < 1:
            raise ConfigError(
                f"algorithm.noisings_per_sample must be >= 1, got {self.noisings_per_sample}"
            )
        if not 0 <= self.time_min < self.time_max <= 1:
            raise ConfigError(
                "need 0 <= algorithm.time_min < algorithm.time_max <= 1, got "
                f"{self.time_min} and {self.time_max}"
            )


@dataclass
class RAMObjectiveConfig(NoisingConfig):
    """RAM's fields (besides the noisings')."""

    reward_multiplier: float = 100.0
    """``m``: scales the advantages in the target (released configs: 100 GenEval/OCR, 1000
    PickScore, whose differences are small); ``1 / m`` acts as the KL weight."""
    correction: Literal["lagged", "current"] = "lagged"
    """Velocity in the correction term: ``lagged`` (the endpoint-sampling copy, the released
    code; one more forward per unit) or ``current`` (eq. 17: the current velocity, detached)."""
    time_weighting: Literal["none", "control"] = "none"
    """Weight of each unit's squared error: ``none`` (released code) or ``control``,
    ``2 (1 - t) / t`` (``t >= 1e-3``), the factor that turns a velocity error into the control
    error of the memoryless SDE (``sigma_t^2 = 2t / (1 - t)``, ``sigma_t u = 2 (v - v_ref)``), as
    in adjoint matching; not used by the released code."""
    min_weight: float | None = None
    """Floor of the per-sample weight ``w = m A`` (> -1, e.g. -0.9). A sample's own fixed point
    of the semi-gradient, ``v = (v_ref + w u) / (1 + w)``, flips sign for ``w < -1``; the
    released code does not clamp (None), because per-prompt advantages average to zero, so the
    mean weight at a point stays near 0. The share of units with ``w < -1`` is logged."""
    std_mode: Literal["group", "global", "none"] = "global"
    """Advantage normaliser: per-prompt mean, std of the whole iteration's rewards (released
    code) or per prompt, or none."""

    def validate_objective(self) -> None:
        self.validate_noising()
        if self.reward_multiplier <= 0:
            raise ConfigError(
                f"algorithm.reward_multiplier must be positive, got {self.reward_multiplier}"
            )
        if self.min_weight is not None and not self.min_weight > -1:
            raise ConfigError(
                f"algorithm.min_weight must be > -1 (where the fixed point flips sign), got "
                f"{self.min_weight}"
            )


@dataclass
class GDROObjectiveConfig(NoisingConfig):
    """GDRO's fields (besides the noisings')."""

    beta: float = 6.0
    """Implicit-reward scale ``T * beta_KL`` (paper: 6 GenEval, 12 OCR; with ``reduction=mean``
    the values are not comparable to the paper's if it sums over dims)."""
    tau: float = 0.05
    """Temperature of the soft ranking targets ``softmax(r / tau)`` on raw rewards (paper: 0.05;
    0 = hard Plackett-Luce)."""
    gamma: float = 1.0
    """Weight of the best sample's flow-matching loss (paper: 1.0 GenEval, 0.5 OCR)."""
    reduction: Literal["mean", "sum"] = "mean"
    """Reduction over dims inside the squared norms of the implicit reward."""
    share_noise: bool = True
    """One ``eps`` for the whole group (as Diffusion-DPO's pairs); False draws one per member
    (``t`` is always shared)."""

    def validate_objective(self) -> None:
        self.validate_noising()
        if self.beta <= 0:
            raise ConfigError(f"algorithm.beta must be positive, got {self.beta}")
        if self.tau < 0 or self.gamma < 0:
            raise ConfigError(f"algorithm.tau and gamma must be >= 0, got {self.tau}, {self.gamma}")


@dataclass
class NFTObjectiveConfig(NoisingConfig):
    """DiffusionNFT's fields (besides the noisings')."""

    beta: float = 1.0
    """Strength of the implicit guidance: ``v+ = beta v + (1 - beta) v_old`` (released configs:
    1.0 GenEval/PickScore/HPS, 0.1 OCR and multi-reward)."""
    advantage_clip: float = 5.0
    """``A_max``: advantages are clipped to +-this and mapped to ``r = A / (2 A_max) + 1/2``; the
    policy loss is also scaled by it (released code: 5)."""
    adv_mode: Literal["all", "positive_only", "negative_only", "one_only", "binary"] = "all"
    """How clipped advantages enter ``r`` (the released ``train_nft_sd3.py``'s
    ``config.train.adv_mode``): ``all`` as they are; ``positive_only`` / ``negative_only`` keep
    one sign (the other becomes 0, i.e. ``r = 1/2``); ``one_only``: 1 for positive, else 0;
    ``binary``: their sign (-1, 0, +1)."""
    kl_beta: float = 1e-4
    """Weight of ``mean (v - v_ref)^2`` (released code: 1e-4; 0 skips the reference forward)."""
    std_mode: Literal["group", "global", "none"] = "global"
    """Advantage normaliser (released code: per-prompt mean, global std)."""

    def validate_objective(self) -> None:
        self.validate_noising()
        if self.beta <= 0:
            raise ConfigError(f"algorithm.beta must be positive, got {self.beta}")
        if self.advantage_clip <= 0:
            raise ConfigError(
                f"algorithm.advantage_clip must be positive, got {self.advantage_clip}"
            )
        if self.kl_beta < 0:
            raise ConfigError(f"algorithm.kl_beta must be >= 0, got {self.kl_beta}")


@dataclass
class AWMObjectiveConfig(NoisingConfig):
    """AWM's fields (besides the noisings'); defaults are the released GenEval / OCR configs'
    (``config/dgx_awm.py``: ``geneval_sd3_no_cfg_1node``, ``ocr_sd3_no_cfg_1node``)."""

    noisings_per_sample: int = 6
    """Noise levels trained per sample (released ``train_timesteps``: 6)."""
    time_sampling: Literal["uniform", "linear", "logit_normal", "sampler_steps"] = "sampler_steps"
    """``t`` among the sampler's own noise levels, stratified (released ``time_type``
    ``discrete_wo_init``); the other densities use ``time_min``, ``time_max`` without strata."""
    skip_first_level: bool = True
    """With ``sampler_steps``: leave out the sampler's first level ``sigma_0`` (released
    ``discrete_wo_init`` for GenEval / OCR; PickScore's ``discrete`` keeps it: False)."""
    level_fraction: float = 0.9
    """With ``sampler_steps``: draw from the levels before index ``int(fraction * num_steps)``
    (released ``timestep_fraction``: 0.9)."""
    weighting: Weighting = "ghuber"
    """Per-unit loss ``g(e, t)`` (released ``weighting``: ``ghuber``)."""
    ghuber_power: float = 0.25
    """Power of the generalised Huber loss (released: 0.25)."""
    beta: float = 0.001
    """KL to the frozen model (released ``train.beta``: 0.001 GenEval; 0.003 OCR, 1e-4
    PickScore; 0 skips its forward)."""
    lagged_beta: float = 1.0
    """KL to the lagged EMA copy (released ``ema_beta``: 1; 0 skips the copy)."""
    advantage_clip: float = 5.0
    """Advantages clipped to +-this (released ``adv_clip_max``: 5) ..."""
    advantage_max: float = 1.0
    """... then scaled by ``advantage_max / advantage_clip`` (released ``advantage_max``: 1), so
    they lie in ``[-1, 1]``."""
    std_mode: Literal["group", "global", "none"] = "global"
    """Advantage normaliser after the per-prompt mean (released ``global_std``: True)."""

    def validate_objective(self) -> None:
        self.validate_noising()
        if self.beta < 0 or self.lagged_beta < 0:
            raise ConfigError("algorithm.beta and algorithm.lagged_beta must be >= 0")
        if self.ghuber_power <= 0:
            raise ConfigError(f"algorithm.ghuber_power must be positive, got {self.ghuber_power}")
        if not 0 < self.level_fraction <= 1:
            raise ConfigError(
                f"algorithm.level_fraction must lie in (0, 1], got {self.level_fraction}"
            )
        if self.advantage_clip <= 0 or self.advantage_max <= 0:
            raise ConfigError("algorithm.advantage_clip and algorithm.advantage_max must be > 0")


@dataclass
class DGPOObjectiveConfig(NoisingConfig):
    """DGPO's fields (besides the noisings'); defaults are the released OCR config's
    (``config/dgpo.py: general_ocr_sd3_4gpu``, the README's default mode)."""

    noisings_per_sample: int = 4
    """Noise levels trained per group (released ``num_train_timesteps``: 4)."""
    time_sampling: Literal["uniform", "linear", "logit_normal", "sampler_steps"] = "sampler_steps"
    """``t`` among the sampler's own noise levels, as the released code does."""
    sampler_levels: int | None = 7
    """With ``sampler_steps``: draw only from the sampler's first (noisiest) levels, this many
    (released ``trunc_steps + 1``: 7 of 10 for OCR, 5 for GenEval); None: all of them."""
    beta: float = 100.0
    """DPO scale ``beta_dpo`` of the group margin (released: 100; 10 PickScore)."""
    kl_beta: float = 0.02
    """Weight of ``mean (v - v_ref)^2`` (released ``train.beta``: 0.02 OCR/GenEval, 0.001
    PickScore; 0 skips it)."""
    clip_range: float | None = 0.01
    """PPO-style clip of the flow-matching likelihood ratio against the lagged copy (released
    ``clip_range`` with ``clip_dsm``: 0.01 OCR/GenEval); None: no clipping, no lagged forward."""
    clip_kl: bool = False
    """Detach the KL on clipped members too (released ``clip_kl``: False)."""
    reference: Literal["frozen", "lagged"] = "frozen"
    """The DPO reference: the frozen model (released default) or the lagged copy (released
    ``use_ema_ref``, used with a far larger ``beta``, 2000-5000). The KL is always to the
    frozen model."""
    reference_guidance_scale: float = 1.0
    """CFG of the frozen model's velocity (released ``kl_cfg``: 1.0 when sampling with CFG; 4.5
    in the CFG-free mode). The current and lagged velocities never use CFG."""
    advantage_clip: float = 5.0
    """Advantages clipped to +-this before the loss (released ``adv_clip_max``: 5)."""
    std_mode: Literal["group", "global", "none"] = "global"
    """Advantage normaliser after the per-prompt mean (released ``global_std``: True for OCR and
    PickScore, i.e. ``global``; False for GenEval, ``group``)."""
    share_noise: bool = True
    """One ``eps`` per group and noising (released ``use_shared_noise``: True); False draws one
    per member (``t`` is always shared)."""

    def validate_objective(self) -> None:
        self.validate_noising()
        if self.beta <= 0:
            raise ConfigError(f"algorithm.beta must be positive, got {self.beta}")
        if self.kl_beta < 0:
            raise ConfigError(f"algorithm.kl_beta must be >= 0, got {self.kl_beta}")
        if self.clip_range is not None and self.clip_range <= 0:
            raise ConfigError(f"algorithm.clip_range must be positive, got {self.clip_range}")
        if self.sampler_levels is not None and self.sampler_levels < 1:
            raise ConfigError(f"algorithm.sampler_levels must be >= 1, got {self.sampler_levels}")
        if self.advantage_clip <= 0:
            raise ConfigError(
                f"algorithm.advantage_clip must be positive, got {self.advantage_clip}"
            )

    @property
    def needs_lagged_copy(self) -> bool:
        """The clip and the ``lagged`` reference need the lagged copy's velocity."""
        return self.clip_range is not None or self.reference == "lagged"
