"""DDPO: denoising diffusion policy optimisation, the per-step PPO of Black et al., "Training
Diffusion Models with Reinforcement Learning" (ICLR 2024; arXiv 2305.13301).

Each trajectory of DDIM steps with eta > 0 (``samplers/ddim.py``, Song et al. 2021, eq. 12 and
16) is an episode whose every step is a Gaussian action with a tractable log-prob; the reward
of the final image is standardised per prompt by a buffer of that prompt's last rewards
(DDPO's ``PerPromptStatTracker``), clipped to +-5, and every trained step contributes the
PPO-clipped ratio term (the paper's importance-sampling estimator, DDPO_IS, with the clipped
surrogate of its ``train.py`` L539-551):

    L = mean_{i, t} max(-A_i r_{i,t}, -A_i clip(r_{i,t}, 1 - 1e-4, 1 + 1e-4)).

The pairing: ``DDIMRollout`` (``sampler.*``: ``DDIMSamplingConfig``) and ``DDPOObjective``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from genrl.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from genrl.objectives.diffusion_configs import DDPOObjectiveConfig
from genrl.rollouts.configs import DDIMSamplingConfig

if TYPE_CHECKING:
    from genrl.objectives.ddim_policy_gradient import DDPOObjective
    from genrl.policies.protocols import Policy
    from genrl.rollouts.ddim import DDIMRollout


@dataclass
class DDPOConfig(DDPOObjectiveConfig, AlgorithmConfig):
    """DDPO's fields (``genrl/objectives/diffusion_configs.py``) with its released defaults;
    the rollout's are ``sampler.*`` (50 DDIM steps, eta 1, guidance 5)."""

    name: str = "ddpo"
    """Registry name."""

    def validate(self, train_config: Any = None) -> None:
        self.validate_loss(train_config)
        self.validate_objective(train_config)
        self.validate_ddpo(train_config)


@register_algorithm("ddpo")
class DDPO(Algorithm):
    Config = DDPOConfig
    sections: ClassVar[dict[str, type]] = {"sampler": DDIMSamplingConfig}
    # The baseline is each prompt's reward buffer, not its group in the batch.
    needs_groups: ClassVar[bool] = False
    config: DDPOConfig

    def build(self, policy: Policy) -> tuple[DDIMRollout, DDPOObjective]:
        from genrl.objectives.ddim_policy_gradient import DDPOObjective
        from genrl.policies.protocols import DiffusionPolicy, require
        from genrl.rollouts.ddim import DDIMRollout

        rollout = DDIMRollout.from_config(
            self.train_config, require(policy, DiffusionPolicy, "ddpo")
        )
        objective = DDPOObjective(self.config, rollout, self.train_config.train.minibatch_size)
        return rollout, objective
