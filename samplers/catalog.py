"""What a config may name as ``sampler.name``, readable without torch.

The command line checks a config before it imports torch (a mistyped sampler answers at once),
so the names and the two facts the check needs live here, next to where each class is found.
``samplers.SAMPLERS`` maps the same names to the classes, and ``tests/test_samplers.py`` keeps
the two equal (each class's ``stochastic`` and ``noise_level_range`` match its entry).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplerEntry:
    target: str
    """``"module:Class"`` of the sampler, imported by ``samplers.SAMPLERS`` on first use."""
    stochastic: bool
    """Whether its steps have a density (a rollout with log-probs needs one)."""
    noise_level_range: tuple[float, float] = (0.0, math.inf)
    """The ``noise_level`` values it is defined for."""


SAMPLER_CATALOG: dict[str, SamplerEntry] = {
    "flow_ode": SamplerEntry("samplers.flow_ode:FlowODESampler", stochastic=False),
    "flow_sde": SamplerEntry("samplers.flow_sde:FlowSDESampler", stochastic=True),
    # Flow-GRPO's Wan SDE
    "flow_sde_linear": SamplerEntry(
        "samplers.flow_sde_linear:FlowSDELinearSampler", stochastic=True
    ),
    "dance_sde": SamplerEntry("samplers.dance_sde:DanceSDESampler", stochastic=True),
    # the angle a pi / 2 must stay in [0, pi / 2]
    "flow_cps": SamplerEntry("samplers.flow_cps:FlowCPSSampler", True, (0.0, 1.0)),
}
