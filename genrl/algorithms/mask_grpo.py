"""MaskGRPO: GRPO for masked-diffusion LMs with importance ratios on re-masked tokens.

The completions of a group are sampled by unmasking (``samplers/masked.py``); rewards become
group advantages as in GRPO, and every token is scored under seeded corruptions of its sample:
MaskGRPO's rising mask ratio with fading-out masking by default (the objective and the views in
``genrl/objectives/masked_tokens.py``).

The pairing: ``UnmaskingRollout`` (text) or ``ImageUnmaskingRollout`` (masked image-token
models such as aMUSEd), both reading ``generation.*``, and ``MaskedTokenPolicyGradient``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from genrl.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from genrl.config.errors import ConfigError
from genrl.objectives.token_configs import MaskedViewsConfig, TokenPolicyGradientConfig
from genrl.rollouts.configs import UnmaskingConfig

if TYPE_CHECKING:
    from genrl.objectives.masked_tokens import MaskedTokenPolicyGradient
    from genrl.policies.protocols import Policy
    from genrl.rollouts.masked import UnmaskingRolloutBase


@dataclass
class MaskGRPOConfig(MaskedViewsConfig, TokenPolicyGradientConfig, AlgorithmConfig):
    """MaskGRPO's fields: the views' and the token objective's, with the released recipe's
    defaults; the rollout's are ``generation.*``."""

    name: str = "mask_grpo"
    """Registry name."""
    aggregation: Literal["sequence_mean", "token_mean", "bnpo", "sequence_sum", "constant"] = "bnpo"
    """Reduction over counted tokens: both released codes take one token mean over the local
    minibatch (``bnpo``); see ``genrl.objectives.losses.aggregate`` for the others."""
    std_eps: float = 1e-5
    """Added to the std (MaskGRPO: 1e-5)."""
    kl_beta: float = 0.01
    """Weight of the k3 KL to the reference on the same views (MaskGRPO 0.01, d1 0.04); 0
    skips it."""

    def validate(self, train_config: Any = None) -> None:
        self.validate_views(train_config)
        self.validate_objective(train_config)
        if self.tis_cap is not None:
            # Masked-diffusion log-probs are estimates on random views, not the sampler's own
            # probabilities, and the unmasking rollouts record none: there is no ratio to cap.
            raise ConfigError(
                "algorithm.tis_cap needs the rollout engine's sampling log-probs, which the "
                "masked-diffusion rollouts do not record; leave it unset for mask_grpo"
            )

    @classmethod
    def d1(cls, **changes: Any) -> MaskGRPOConfig:
        """diffu-GRPO's settings: MaskGRPO with d1's estimator and defaults.

        Zhao et al., "d1: Scaling Reasoning in Diffusion Large Language Models via
        Reinforcement Learning" (2025), diffu-GRPO: every inner iteration scores the sampled
        completion in ONE forward with the completion fully masked and each prompt token masked
        with probability 0.15 (a fresh seed per iteration, shared by the old, current and
        reference policies); per-token log-probs are the mean-field estimate. Advantages are
        ``r - mean_group`` (no std), mu = 12 iterations, clip 0.5, beta 0.04. These are field
        values, not another algorithm: the same fields on the command line
        (``--set algorithm.estimator=d1 --set algorithm.clip_range=0.5 ...``) give the same run.
        ``changes`` override any of them.
        """
        d1 = {"estimator": "d1", "num_iterations": 12, "clip_range": 0.5, "std_mode": "none"}
        return cls(**{**d1, "kl_beta": 0.04, **changes})


@register_algorithm("mask_grpo")
class MaskGRPO(Algorithm):
    Config = MaskGRPOConfig
    sections: ClassVar[dict[str, type]] = {"generation": UnmaskingConfig}
    config: MaskGRPOConfig

    def build(self, policy: Policy) -> tuple[UnmaskingRolloutBase, MaskedTokenPolicyGradient]:
        """A masked-diffusion LM samples text (``UnmaskingRollout``), a masked image-token
        model images (``ImageUnmaskingRollout``); one objective trains both."""
        # Imported here: the rollout and the objective are tensor code, and the registry and
        # this config are read before torch (the command line checks a config first).
        from genrl.objectives.masked_tokens import MaskedTokenPolicyGradient
        from genrl.policies.protocols import (
            MaskedImagePolicy,
            MaskedTokenPolicy,
            UnmaskingPolicy,
            require,
        )
        from genrl.rollouts.masked import UnmaskingRollout
        from genrl.rollouts.masked_images import ImageUnmaskingRollout

        require(policy, UnmaskingPolicy, self.config.name)
        rollout: UnmaskingRolloutBase
        if isinstance(policy, MaskedImagePolicy):
            image_rollout = ImageUnmaskingRollout(self.train_config)
            image_rollout.check_policy(policy)
            rollout = image_rollout
        else:
            require(policy, MaskedTokenPolicy, self.config.name)
            rollout = UnmaskingRollout(self.train_config)
        return rollout, MaskedTokenPolicyGradient(self.config, self.train_config)
