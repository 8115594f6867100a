"""Flow-GRPO's objective on DDIM trajectories of an epsilon / v-prediction diffusion model.

Flow-GRPO (Liu et al. 2025) makes a flow model's sampling stochastic so that each step has a
log-prob; a classic diffusion model's DDIM step with eta > 0 already has one (Song et al. 2021,
eq. 12 and 16; DDPO's sampler, ``samplers/ddim.py``). The objective is Flow-GRPO's unchanged:
per-prompt group advantages (eq. 4), the clipped ratio of every trained step and a KL to the
reference on the step means (eq. 12), which for a DDIM step of std ``sigma_t`` is the exact
``mean((mu - mu_ref)^2) / (2 sigma_t^2)``.

The pairing: ``DDIMRollout`` (``sampler.*``: ``DDIMSamplingConfig``) and ``DDIMPolicyGradient``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from genrl.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from genrl.objectives.diffusion_configs import validate_ddim_objective
from genrl.objectives.flow_configs import FlowPolicyGradientConfig
from genrl.rollouts.configs import DDIMSamplingConfig

if TYPE_CHECKING:
    from genrl.objectives.ddim_policy_gradient import DDIMPolicyGradient
    from genrl.policies.protocols import Policy
    from genrl.rollouts.ddim import DDIMRollout


@dataclass
class DDIMGRPOConfig(FlowPolicyGradientConfig, AlgorithmConfig):
    """Flow-GRPO's objective fields (``genrl/objectives/flow_configs.py``) and defaults; the
    rollout's are ``sampler.*``."""

    name: str = "ddim_grpo"
    """Registry name."""

    def validate(self, train_config: Any = None) -> None:
        self.validate_loss(train_config)
        self.validate_objective(train_config)
        validate_ddim_objective(self, "ddim_grpo")


@register_algorithm("ddim_grpo")
class DDIMGRPO(Algorithm):
    Config = DDIMGRPOConfig
    sections: ClassVar[dict[str, type]] = {"sampler": DDIMSamplingConfig}
    config: DDIMGRPOConfig

    def build(self, policy: Policy) -> tuple[DDIMRollout, DDIMPolicyGradient]:
        from genrl.objectives.ddim_policy_gradient import DDIMPolicyGradient
        from genrl.policies.protocols import DiffusionPolicy, require
        from genrl.rollouts.ddim import DDIMRollout

        rollout = DDIMRollout.from_config(
            self.train_config, require(policy, DiffusionPolicy, "ddim_grpo")
        )
        objective = DDIMPolicyGradient(self.config, rollout, self.train_config.train.minibatch_size)
        return rollout, objective
