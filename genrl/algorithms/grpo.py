"""The GRPO family for token policies: GRPO, Dr.GRPO, DAPO's loss, GSPO and RLOO.

Shao et al., "DeepSeekMath" (2024), eq. 3 (the objective in ``genrl/objectives/tokens.py``).
The variants are settings of one config: Dr.GRPO (Liu et al. 2025) = ``std_mode=none`` with the
``constant`` aggregation; DAPO's loss (Yu et al. 2025) = ``clip_range_high=0.28`` with the
``token_mean`` aggregation and the overlong penalty reward; GSPO (Zheng et al. 2025) =
``ratio_level=sequence``; RLOO (Ahmadian et al. 2024) = ``advantage=rloo``; MC-GRPO (Kim 2026) =
``advantage=median``; MSSR (Liu et al. 2025), single-rollout = ``advantage=mssr`` with
``train.group_size=1``.

The pairing: ``AutoregressiveRollout`` (``generation.*``) and ``TokenPolicyGradient``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from genrl.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from genrl.objectives.token_configs import TokenPolicyGradientConfig
from genrl.rollouts.configs import GenerationConfig

if TYPE_CHECKING:
    from genrl.objectives.tokens import TokenPolicyGradient
    from genrl.policies.protocols import Policy
    from genrl.rollouts.tokens import AutoregressiveRollout


@dataclass
class GRPOConfig(TokenPolicyGradientConfig, AlgorithmConfig):
    """GRPO's fields: the token objective's, and the ratio level; the rollout's are
    ``generation.*``."""

    name: str = "grpo"
    """Registry name."""
    ratio_level: Literal["token", "sequence"] = "token"
    """``token`` (GRPO/DAPO) or ``sequence`` (GSPO: one length-normalised ratio per answer; pair
    it with ``aggregation=sequence_mean``, which verl's GSPO loss always uses)."""

    def validate(self, train_config: Any = None) -> None:
        self.validate_objective(train_config, mssr=True)


@register_algorithm("grpo")
class GRPO(Algorithm):
    Config = GRPOConfig
    sections: ClassVar[dict[str, type]] = {"generation": GenerationConfig}
    config: GRPOConfig

    def build(self, policy: Policy) -> tuple[AutoregressiveRollout, TokenPolicyGradient]:
        # Imported here: the rollout and the objective are tensor code, and the registry and
        # this config are read before torch (the command line checks a config first).
        from genrl.objectives.tokens import TokenPolicyGradient
        from genrl.policies.protocols import CausalTokenPolicy, require
        from genrl.rollouts.tokens import AutoregressiveRollout

        require(policy, CausalTokenPolicy, "grpo")
        rollout = AutoregressiveRollout(self.train_config)
        objective = TokenPolicyGradient(
            self.config, rollout, self.train_config, self.config.ratio_level
        )
        return rollout, objective
