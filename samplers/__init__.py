"""Samplers: pure tensor math for stepping generative models, with log-probabilities.

Nothing here loads a model. Every stochastic step follows one contract::

    step(model_output, timestep_index, sample, *, prev_sample=None, generator=None, noise=None)
        -> StepOutput(prev_sample, log_prob, mean, std)

Given ``prev_sample`` the step re-scores that sample instead of drawing a new one, so the same
function serves rollouts (sampling) and training (re-scoring under the current parameters).
Every sampler also exposes ``stochastic_steps``, a ``[T]`` bool tensor of the steps with a
density (std > 0), i.e. the steps an algorithm can train on.

The stochastic flow samplers (Flow-GRPO SDE and its Wan variant, DanceGRPO SDE, CPS) share ``GaussianFlowSampler``
and take the same ``(sigmas, noise_level, log_prob_reduction)`` arguments. DDIM's stochastic
step for epsilon / v-prediction diffusion models (``samplers.ddim``, DDPO's sampler) follows the
same step contract on a ``DDIMSchedule`` (the scheduler's timesteps and ``alphas_cumprod``)
instead of sigmas; it is not in ``SAMPLER_CATALOG``, whose names the flow rollouts choose from.

The package imports no torch until a name is used (PEP 562), so that ``samplers.catalog`` (the
names a config may choose, with their traits) is read by the config checks before torch loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from samplers.catalog import SAMPLER_CATALOG

if TYPE_CHECKING:
    from samplers.base import LOG_PROB_REDUCTIONS, StepOutput, gaussian_log_prob
    from samplers.dance_sde import DanceSDESampler
    from samplers.ddim import DDIMSampler, DDIMSchedule, step_with_logprob
    from samplers.flow_cps import FlowCPSSampler
    from samplers.flow_ode import FlowODESampler
    from samplers.flow_sde import FlowSDESampler
    from samplers.flow_sde_linear import FlowSDELinearSampler
    from samplers.gaussian import GaussianFlowSampler
    from samplers.schedules import flow_sigmas, shift_sigmas

    SAMPLERS: dict[str, type]

# public name -> the module that defines it
_HOMES = {
    "LOG_PROB_REDUCTIONS": "samplers.base",
    "StepOutput": "samplers.base",
    "gaussian_log_prob": "samplers.base",
    "DanceSDESampler": "samplers.dance_sde",
    "DDIMSampler": "samplers.ddim",
    "DDIMSchedule": "samplers.ddim",
    "step_with_logprob": "samplers.ddim",
    "FlowCPSSampler": "samplers.flow_cps",
    "FlowODESampler": "samplers.flow_ode",
    "FlowSDESampler": "samplers.flow_sde",
    "FlowSDELinearSampler": "samplers.flow_sde_linear",
    "GaussianFlowSampler": "samplers.gaussian",
    "flow_sigmas": "samplers.schedules",
    "shift_sigmas": "samplers.schedules",
}


def _load(target: str) -> Any:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def __getattr__(name: str) -> Any:
    """A public name, imported on first access; ``SAMPLERS`` maps every catalogued name to its
    class."""
    if name == "SAMPLERS":
        value: Any = {key: _load(entry.target) for key, entry in SAMPLER_CATALOG.items()}
    elif name in _HOMES:
        value = _load(f"{_HOMES[name]}:{name}")
    else:
        raise AttributeError(f"module 'samplers' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "LOG_PROB_REDUCTIONS",
    "SAMPLERS",
    "SAMPLER_CATALOG",
    "DDIMSampler",
    "DDIMSchedule",
    "DanceSDESampler",
    "FlowCPSSampler",
    "FlowODESampler",
    "FlowSDELinearSampler",
    "FlowSDESampler",
    "GaussianFlowSampler",
    "StepOutput",
    "flow_sigmas",
    "gaussian_log_prob",
    "shift_sigmas",
    "step_with_logprob",
]
