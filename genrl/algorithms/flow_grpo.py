"""Flow-GRPO: GRPO for flow-matching generators through a stochastic (SDE) sampler.

Liu et al., "Flow-GRPO: Training Flow Matching Models via Online RL" (2025). Each prompt's group of
images is sampled with the SDE of ``samplers.flow_sde`` so that every denoising step is a Gaussian
policy with a tractable log-prob (eq. 9-10). Rewards become per-prompt advantages (eq. 4); each
trained step contributes a PPO-clipped ratio term plus a KL to the reference policy on the step
means (eq. 12):

    L = mean_{i, t} max(-A_i r_{i,t}, -A_i clip(r_{i,t}, 1 - eps, 1 + eps))
        + beta * KL(pi_theta(.|x_t) || pi_ref(.|x_t)),   r_{i,t} = pi_theta / pi_old.

The pairing: ``FlowSDERollout`` (SDE windows: Flow-GRPO-Fast, MixGRPO; DanceGRPO's and CPS's
steps through ``sampler.name``) and ``FlowPolicyGradient``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from genrl.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from genrl.objectives.flow_configs import FlowPolicyGradientConfig
from genrl.rollouts.configs import SDESamplingConfig

if TYPE_CHECKING:
    from genrl.objectives.flow_policy_gradient import FlowPolicyGradient
    from genrl.policies.protocols import Policy
    from genrl.rollouts.flow_sde import FlowSDERollout


@dataclass
class FlowGRPOConfig(FlowPolicyGradientConfig, AlgorithmConfig):
    """Flow-GRPO's fields: the objective's (``genrl/objectives/flow_configs.py``) with
    the reference's defaults; the rollout's are ``sampler.*``."""

    name: str = "flow_grpo"
    """Registry name."""

    def validate(self, train_config: Any = None) -> None:
        self.validate_loss(train_config)
        self.validate_objective(train_config)


@register_algorithm("flow_grpo")
class FlowGRPO(Algorithm):
    Config = FlowGRPOConfig
    sections: ClassVar[dict[str, type]] = {"sampler": SDESamplingConfig}
    config: FlowGRPOConfig

    def build(self, policy: Policy) -> tuple[FlowSDERollout, FlowPolicyGradient]:
        """The SDE rollout on the policy's noise schedule (measuring the per-step KL for
        ``kl_reward``, keeping step means for ``ratio_norm``) and Flow-GRPO's objective."""
        # Imported here: the rollout and the objective are tensor code, and the registry and
        # this config are read before torch (the command line checks a config first).
        from genrl.objectives.flow_policy_gradient import FlowPolicyGradient
        from genrl.policies.protocols import FlowPolicy, require
        from genrl.rollouts.flow_sde import FlowSDERollout

        rollout = FlowSDERollout.from_config(
            self.train_config,
            require(policy, FlowPolicy, "flow_grpo"),
            measure_kl=self.config.kl_reward > 0,
            keep_means=self.config.ratio_norm,
        )
        objective = FlowPolicyGradient(self.config, rollout, self.train_config.train.minibatch_size)
        return rollout, objective
