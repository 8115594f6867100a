"""AWM: Advantage Weighted Matching (Xue, Ge, Zhang, Li, Ma 2025, arXiv 2509.25050).

RL with the pretraining loss: each endpoint of the current model is noised as in pretraining at
a few of the sampler's noise levels, and its (generalised Huber, time-weighted) flow-matching
error is weighted by its advantage (``AdvantageWeightedMatchingLoss``). The released code adds
two velocity KLs: a small one to the frozen model and one of weight 1 to a lagged EMA copy of
the weights (decay ``min(0.001 k, 0.3)``), here the endpoint rollout's lagged copy, which in AWM
never samples.

Differences from the released code, on purpose (``docs/algorithms/awm.md``): our Euler ODE
instead of its SA-Solver (stochastic between t = 0.3 and 0.9 for GenEval/OCR); each sample
draws its own stratified levels (the reference shares them within a microbatch of 2-3
samples); the evaluation EMA and the learning-rate schedule are the recipe's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from genrl.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from genrl.objectives.regression_configs import AWMObjectiveConfig
from genrl.rollouts.configs import FlowSamplingConfig, LaggedCopyConfig

if TYPE_CHECKING:
    from genrl.objectives.advantage_weighted_matching import AWMObjective
    from genrl.policies.protocols import Policy
    from genrl.rollouts.endpoints import EndpointRollout


@dataclass
class AWMConfig(AWMObjectiveConfig, LaggedCopyConfig, AlgorithmConfig):
    """AWM's fields: the objective's (``genrl/objectives/regression_configs.py``) and
    the lagged copy's (``genrl/rollouts/configs.py``), with the released GenEval config's
    defaults."""

    name: str = "awm"
    """Registry name."""
    sampling_ema_decay: float = 0.3
    """Largest decay of the lagged copy (released ``kl_ema_decay``: 0.3, with
    ``kl_ema_decay_type`` linear: ``min(0.3, 0.001 * step)``)."""
    sampling_ema_ramp: float = 0.001
    """Per-iteration growth of its decay (released: 0.001 per optimizer step, one per
    iteration)."""

    def validate(self, train_config: Any = None) -> None:
        del train_config
        self.validate_objective()
        self.validate_lagged_copy()


@register_algorithm("awm")
class AWM(Algorithm):
    Config = AWMConfig
    sections: ClassVar[dict[str, type]] = {"sampler": FlowSamplingConfig}
    config: AWMConfig

    def build(self, policy: Policy) -> tuple[EndpointRollout, AWMObjective]:
        # Imported here: the rollout and the objective are tensor code, and the registry and
        # this config are read before torch (the command line checks a config first).
        from genrl.objectives.advantage_weighted_matching import AWMObjective
        from genrl.policies.protocols import FlowPolicy, require
        from genrl.rollouts.endpoints import EndpointRollout

        flow = require(policy, FlowPolicy, "awm")
        # The current weights sample (released ``off_policy`` False); the lagged copy is kept
        # only for its KL term.
        lagged = self.config if self.config.lagged_beta > 0 else None
        rollout = EndpointRollout(self.train_config, flow, lagged=lagged, sample_with_lagged=False)
        return rollout, AWMObjective(self.config, rollout, self.train_config.train.group_size)
