"""Coefficients-preserving sampling (CPS) for flow-matching models.

Wang & Yu, "Coefficients-Preserving Sampling for Reinforcement Learning with Flow Matching"
(2025). With ``x_s = (1 - s) x0 + s eps`` and ``v = eps - x0``, the model's predictions at level
``s`` are ``x0_hat = x - s v`` and ``eps_hat = x + (1 - s) v``. The CPS step to ``s_next`` re-mixes
them so that the noise coefficient of ``x_next`` is exactly ``s_next``, as the forward process
requires (the paper shows that the Euler-Maruyama SDE steps of Flow-GRPO and DanceGRPO do not,
which leaves visible noise in the samples):

    std  = s_next * sin(a pi / 2)
    mean = (1 - s_next) x0_hat + sqrt(s_next^2 - std^2) eps_hat
         = (1 - s_next) x0_hat + s_next cos(a pi / 2) eps_hat,
    x_next ~ N(mean, std^2 I),    std^2 + (s_next cos(a pi / 2))^2 = s_next^2.

In terms of ``x`` and ``v`` the mean is the Euler step minus the part of ``eps_hat`` that is
replaced by fresh noise, ``mean = x + (s_next - s) v - s_next (1 - cos(a pi / 2)) eps_hat``,
which is how the table is built: with ``a = 0`` the coefficients are exactly ``1`` and ``dt``, so
the step is bit for bit the ODE (Euler) step.

At the last step ``s_next = 0``: ``std = 0`` and ``mean = x0_hat``, a deterministic step; its
log-prob is exactly 0 and ``stochastic_steps`` marks it False (it cannot be trained on).

Log-density: this is the true Gaussian ``log N(x_next; mean, std^2)``. The Flow-GRPO/CPS reference
code (``sde_type="cps"``) uses ``-(x_next - mean)^2`` instead, dropping the constant and the
``1 / (2 std^2)`` factor. Constants cancel in the policy ratio, but the factor does not: the
reference's log-ratio is ``2 std^2`` times this one, step by step, so its ratio scale, clip ranges
(e.g. 1e-5) and KL weights do not transfer to this sampler as they are.
"""

from __future__ import annotations

import math

import torch

from samplers.base import LogProbReduction
from samplers.gaussian import GaussianFlowSampler


class FlowCPSSampler(GaussianFlowSampler):
    """Stochastic step with a Gaussian transition log-prob (coefficients-preserving sampling).

    Args:
        sigmas: ``[T + 1]`` noise levels, decreasing from 1 to 0.
        noise_level: ``a`` in ``[0, 1]``: the share of ``s_next`` carried by fresh noise is
            ``sin(a pi / 2)``; CPS configs of the Flow-GRPO code base use 0.8. With 0 the step is exactly the
            ODE (Euler) step and its log-prob is 0; with 1 it is ``(1 - s_next) x0_hat`` plus fresh
            noise of std ``s_next``.
        log_prob_reduction: ``"mean"`` over latent elements or ``"sum"`` (the true joint
            log-density).
    """

    noise_level_range = (0.0, 1.0)  # the angle a pi / 2 must stay in [0, pi / 2]

    def __init__(
        self,
        sigmas: torch.Tensor,
        noise_level: float = 0.8,
        log_prob_reduction: LogProbReduction = "mean",
    ) -> None:
        if not noise_level <= 1:  # the angle a pi / 2 must stay in [0, pi / 2]
            raise ValueError(f"noise_level must be in [0, 1] for CPS, got {noise_level}")
        super().__init__(sigmas, noise_level, log_prob_reduction)

    def _coefficient_table(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        angle = self.noise_level * math.pi / 2
        # 1 - cos(angle) written as 2 sin^2(angle / 2): no cancellation for small a, and exactly 0
        # for a = 0, which makes the coefficients below exactly Euler's.
        one_minus_cos = 2 * math.sin(angle / 2) ** 2
        dt = sigma_next - sigma
        shrink = sigma_next * one_minus_cos  # weight of eps_hat = x + (1 - s) v removed from Euler
        return torch.stack([1 - shrink, dt - shrink * (1 - sigma), sigma_next * math.sin(angle)])
