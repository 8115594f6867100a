"""Samplers: pure tensor math for stepping generative models, with log-probabilities.

Nothing here loads a model. Every stochastic step follows one contract (DESIGN.md section 3)::

    step(model_output, timestep_index, sample, *, prev_sample=None, generator=None, noise=None)
        -> StepOutput(prev_sample, log_prob, mean, std)

Given ``prev_sample`` the step re-scores that sample instead of drawing a new one, so the same
function serves rollouts (sampling) and training (re-scoring under the current parameters).
"""

from samplers.base import LOG_PROB_REDUCTIONS, StepOutput, gaussian_log_prob
from samplers.flow_ode import FlowODESampler
from samplers.flow_sde import FlowSDESampler
from samplers.schedules import flow_sigmas, shift_sigmas

SAMPLERS = {"flow_ode": FlowODESampler, "flow_sde": FlowSDESampler}

__all__ = [
    "LOG_PROB_REDUCTIONS",
    "SAMPLERS",
    "FlowODESampler",
    "FlowSDESampler",
    "StepOutput",
    "flow_sigmas",
    "gaussian_log_prob",
    "shift_sigmas",
]
