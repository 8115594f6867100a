"""Samplers: pure tensor math for stepping generative models, with log-probabilities.

Nothing here loads a model. Every stochastic step follows one contract::

    step(model_output, timestep_index, sample, *, prev_sample=None, generator=None, noise=None)
        -> StepOutput(prev_sample, log_prob, mean, std)

Given ``prev_sample`` the step re-scores that sample instead of drawing a new one, so the same
function serves rollouts (sampling) and training (re-scoring under the current parameters).
Every sampler also exposes ``stochastic_steps``, a ``[T]`` bool tensor of the steps with a
density (std > 0), i.e. the steps an algorithm can train on.

The stochastic flow samplers (Flow-GRPO SDE and its Wan variant, DanceGRPO SDE, CPS) share ``GaussianFlowSampler``
and take the same ``(sigmas, noise_level, log_prob_reduction)`` arguments.
"""

from samplers.base import LOG_PROB_REDUCTIONS, StepOutput, gaussian_log_prob
from samplers.dance_sde import DanceSDESampler
from samplers.flow_cps import FlowCPSSampler
from samplers.flow_ode import FlowODESampler
from samplers.flow_sde import FlowSDESampler
from samplers.flow_sde_linear import FlowSDELinearSampler
from samplers.gaussian import GaussianFlowSampler
from samplers.schedules import flow_sigmas, shift_sigmas

SAMPLERS = {
    "flow_ode": FlowODESampler,
    "flow_sde": FlowSDESampler,
    "flow_sde_linear": FlowSDELinearSampler,  # Flow-GRPO's Wan SDE
    "dance_sde": DanceSDESampler,
    "flow_cps": FlowCPSSampler,
}

__all__ = [
    "LOG_PROB_REDUCTIONS",
    "SAMPLERS",
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
]
