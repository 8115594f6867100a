"""RAM: Reinforce Adjoint Matching (Bergmeister et al. 2026, arXiv 2605.10759).

No SDE rollout, no reward gradient, no adjoint sweep: draw clean endpoints from the model with
the deterministic ODE, score them, noise them as in pretraining at ``noisings_per_sample``
draws of ``t`` (density proportional to ``t`` by default), and regress the velocity onto the
reward-corrected pretraining target (eq. 17):

    L = || v_theta(x_t) - stopgrad( v_ref(x_t) + m A(x_0) ((eps - x_0) - v_corr(x_t)) ) ||^2

``A`` is the per-prompt advantage (global std), ``m`` the ``reward_multiplier``. ``v_corr`` is the
lagged copy of the policy that also draws the endpoints (the released code, default) or the
current velocity detached (eq. 17 as written). Loss velocities are conditional (no CFG) even
when sampling uses CFG, as in the released code. Section 5's path-cost correction is not
implemented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from genrl.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from genrl.objectives.regression_configs import RAMObjectiveConfig
from genrl.rollouts.configs import FlowSamplingConfig, LaggedCopyConfig

if TYPE_CHECKING:
    from genrl.objectives.regression_objectives import RAMObjective
    from genrl.policies.protocols import Policy
    from genrl.rollouts.endpoints import EndpointRollout


@dataclass
class RAMConfig(RAMObjectiveConfig, LaggedCopyConfig, AlgorithmConfig):
    """RAM's fields: the objective's (``genrl/objectives/regression_configs.py``) and the
    lagged copy's (``genrl/rollouts/configs.py``), with the released code's defaults."""

    name: str = "ram"
    """Registry name."""
    noisings_per_sample: int = 8
    """``K`` draws of ``(t, eps)`` per endpoint (released code: 8)."""
    time_sampling: Literal["uniform", "linear", "logit_normal", "sampler_steps"] = "linear"
    """``p(t) = 2t`` (released code)."""
    time_min: float = 0.0
    """``t`` ranges over (0, 1]."""
    time_max: float = 1.0
    """Largest ``t``."""
    sampling_ema_decay: float = 0.9
    """Decay of the lagged copy: ``min(ramp * iteration, this)`` (released code: 0.9 with ramp
    0.01, so the copy starts equal to the policy)."""
    sampling_ema_ramp: float = 0.01
    """Per-iteration growth of the lagged copy's decay."""

    def validate(self, train_config: Any = None) -> None:
        self.validate_objective()
        self.validate_lagged_copy()


@register_algorithm("ram")
class RAM(Algorithm):
    Config = RAMConfig
    sections: ClassVar[dict[str, type]] = {"sampler": FlowSamplingConfig}
    config: RAMConfig

    def build(self, policy: Policy) -> tuple[EndpointRollout, RAMObjective]:
        # Imported here: the rollout and the objective are tensor code, and the registry and
        # this config are read before torch (the command line checks a config first).
        from genrl.objectives.regression_objectives import RAMObjective
        from genrl.policies.protocols import FlowPolicy, require
        from genrl.rollouts.endpoints import EndpointRollout

        flow = require(policy, FlowPolicy, "ram")
        rollout = EndpointRollout(self.train_config, flow, lagged=self.config)
        return rollout, RAMObjective(self.config, rollout, self.train_config.train.group_size)
