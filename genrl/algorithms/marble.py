"""MARBLE: multi-reward balancing on DiffusionNFT (Zhao et al. 2026, arXiv 2605.06507).

DiffusionNFT's rollout (CFG-free endpoints from the lagged copy) and loss, with one advantage
per reward and the per-reward gradients combined by the min-norm quadratic program
(``genrl/objectives/marble.py``); ``balancing=weighted_sum`` is the baseline, DiffusionNFT on
the weighted-sum reward, with the same gradient diagnostics. The paper's training code is not
released (its repository holds a README only), so the choices it leaves open are options of
``BalancingConfig``, listed in ``docs/algorithms/marble.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from genrl.algorithms.base import Algorithm, register_algorithm
from genrl.algorithms.diffusion_nft import DiffusionNFTConfig
from genrl.objectives.balancing_configs import MarbleObjectiveConfig
from genrl.rollouts.configs import FlowSamplingConfig

if TYPE_CHECKING:
    from genrl.objectives.marble import MarbleObjective
    from genrl.policies.protocols import Policy
    from genrl.rollouts.endpoints import EndpointRollout


def _rewards(train_config: Any) -> list[tuple[str, float]]:
    return [(spec.name, float(spec.weight)) for spec in train_config.reward]


@dataclass
class MarbleConfig(MarbleObjectiveConfig, DiffusionNFTConfig):
    """MARBLE's fields: DiffusionNFT's (its released code's defaults) and the balancing's."""

    name: str = "marble"
    """Registry name."""

    def validate(self, train_config: Any = None) -> None:
        super().validate(train_config)
        if train_config is not None:
            self.validate_balancing(_rewards(train_config))


@register_algorithm("marble")
class Marble(Algorithm):
    Config = MarbleConfig
    sections: ClassVar[dict[str, type]] = {"sampler": FlowSamplingConfig}
    config: MarbleConfig

    def build(self, policy: Policy) -> tuple[EndpointRollout, MarbleObjective]:
        # Imported here: tensor code, while the registry and this config load without torch.
        from genrl.objectives.marble import MarbleObjective
        from genrl.policies.protocols import FlowPolicy, require
        from genrl.rollouts.endpoints import EndpointRollout

        flow = require(policy, FlowPolicy, "marble")
        rollout = EndpointRollout(self.train_config, flow, lagged=self.config)
        names = self.config.validate_balancing(_rewards(self.train_config))
        objective = MarbleObjective(self.config, rollout, self.train_config.train.group_size, names)
        return rollout, objective
