"""GDRO: Group-level Direct Reward Optimization (Wang et al. 2026, arXiv 2601.02036).

A DPO-style implicit reward is available at any noise level: for a group of ``k`` samples of one
prompt, noised with one shared ``(t, eps)``, ``s_i = -beta (||u_i - v_theta||^2 - ||u_i - v_ref||^2)``
(eq. 5). The group is ranked by its explicit rewards and trained with a Plackett-Luce loss whose
targets are ``softmax(r / tau)`` over the members not yet placed (eq. 7), plus ``gamma`` times the
flow-matching loss of the best sample, which keeps its likelihood from falling (eq. 8-9).
Nothing depends on how the samples were drawn, so GDRO trains fully offline
(``train.offline_store``: the reference model samples once, training runs many epochs over the
store) or online on the current model's ODE samples. See ``GroupRankingLoss``.

Choices the paper leaves open (documented fields): the squared norms are means over dims
(``reduction``), ``t`` and ``eps`` are shared by the group (``share_noise``), ``t`` is uniform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from genrl.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from genrl.config.errors import ConfigError
from genrl.objectives.regression_configs import GDROObjectiveConfig
from genrl.rollouts.configs import FlowSamplingConfig

if TYPE_CHECKING:
    from genrl.objectives.regression_objectives import GDROObjective
    from genrl.policies.protocols import Policy
    from genrl.rollouts.endpoints import EndpointRollout


@dataclass
class GDROConfig(GDROObjectiveConfig, AlgorithmConfig):
    """GDRO's fields (``genrl/objectives/regression_configs.py``). Its samples come from the
    current model (online) or the reference (offline store): it keeps no lagged copy."""

    name: str = "gdro"
    """Registry name."""
    noisings_per_sample: int = 1
    """Noisings per group and iteration (each one unit of ``k`` members)."""

    def validate(self, train_config: Any = None) -> None:
        self.validate_objective()
        if train_config is not None and train_config.train.group_size < 2:
            raise ConfigError("gdro ranks a group: train.group_size must be >= 2")


@register_algorithm("gdro")
class GDRO(Algorithm):
    Config = GDROConfig
    sections: ClassVar[dict[str, type]] = {"sampler": FlowSamplingConfig}
    config: GDROConfig
    group_units = True
    supports_offline = True

    def build(self, policy: Policy) -> tuple[EndpointRollout, GDROObjective]:
        # Imported here: the rollout and the objective are tensor code, and the registry and
        # this config are read before torch (the command line checks a config first).
        from genrl.objectives.regression_objectives import GDROObjective
        from genrl.policies.protocols import FlowPolicy, require
        from genrl.rollouts.endpoints import EndpointRollout

        flow = require(policy, FlowPolicy, "gdro")
        rollout = EndpointRollout(self.train_config, flow, lagged=None)
        return rollout, GDROObjective(self.config, rollout, self.train_config.train.group_size)
