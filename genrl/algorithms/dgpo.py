"""DGPO: Direct Group Preference Optimization (Luo, Hu, Tang 2025, arXiv 2510.08425; ICLR 2026).

GRPO's use of relative information within a group, without a policy gradient: each group of
deterministic ODE samples is split by advantage into a positive and a negative set, and a
DPO-style loss raises the probability that the positive set is preferred, with Diffusion-DPO's
implicit reward of each member at a noising shared by the group (``GroupPreferenceLoss``). The
released code adds a small velocity KL to the frozen model and a PPO-style clip of each member's
likelihood ratio against a lagged EMA copy (here the endpoint rollout's lagged copy, decay
``min(0.001 k, 0.3)``), which also samples the endpoints.

Differences from the released code, on purpose (``docs/algorithms/dgpo.md``): our Euler ODE
instead of its DPM-Solver; the lagged copy samples from the first iteration (the reference
samples from the current weights for its first 200-500 steps); each group draws its own noise
levels from the noisiest ``sampler_levels`` (the reference draws 4 distinct levels per
iteration, shared by every sample).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from genrl.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from genrl.config.errors import ConfigError
from genrl.objectives.regression_configs import DGPOObjectiveConfig
from genrl.rollouts.configs import FlowSamplingConfig, LaggedCopyConfig

if TYPE_CHECKING:
    from genrl.objectives.group_preference import DGPOObjective
    from genrl.policies.protocols import Policy
    from genrl.rollouts.endpoints import EndpointRollout


@dataclass
class DGPOConfig(DGPOObjectiveConfig, LaggedCopyConfig, AlgorithmConfig):
    """DGPO's fields: the objective's (``genrl/objectives/regression_configs.py``) and the lagged
    copy's (``genrl/rollouts/configs.py``), with the released OCR config's defaults."""

    name: str = "dgpo"
    """Registry name."""
    sampling_ema_decay: float = 0.3
    """Largest decay of the lagged copy (released ``ema_ref``: ``min(0.3, 0.001 * step)``)."""
    sampling_ema_ramp: float = 0.001
    """Per-iteration growth of its decay (released: 0.001 per optimizer step, one per
    iteration)."""

    def validate(self, train_config: Any = None) -> None:
        self.validate_objective()
        self.validate_lagged_copy()
        if train_config is not None and train_config.train.group_size < 2:
            raise ConfigError("dgpo compares members of a group: train.group_size must be >= 2")


@register_algorithm("dgpo")
class DGPO(Algorithm):
    Config = DGPOConfig
    sections: ClassVar[dict[str, type]] = {"sampler": FlowSamplingConfig}
    config: DGPOConfig
    group_units = True

    def build(self, policy: Policy) -> tuple[EndpointRollout, DGPOObjective]:
        # Imported here: the rollout and the objective are tensor code, and the registry and
        # this config are read before torch (the command line checks a config first).
        from genrl.objectives.group_preference import DGPOObjective
        from genrl.policies.protocols import FlowPolicy, require
        from genrl.rollouts.endpoints import EndpointRollout

        flow = require(policy, FlowPolicy, "dgpo")
        # Without a clip or a lagged reference no lagged copy is kept: the current weights sample.
        lagged = self.config if self.config.needs_lagged_copy else None
        rollout = EndpointRollout(self.train_config, flow, lagged=lagged)
        return rollout, DGPOObjective(self.config, rollout, self.train_config.train.group_size)
