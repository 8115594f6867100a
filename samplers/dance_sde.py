"""DanceGRPO's stochastic sampler: Flow-GRPO's reverse SDE with a constant diffusion coefficient.

Xue et al., "DanceGRPO: Unleashing GRPO on Visual Generation" (2025): the rectified-flow reverse
SDE ``dz = (u - eta_t^2 / 2 * grad log p_t(z)) dt + eta_t dw`` of the method section, with a
constant ``eta_t = eta``. The reference code (``flux_step`` with ``sde_solver=True``) forms
``x0_hat = x - s v``, the score estimate

    score = -(x - (1 - s) x0_hat) / s^2 = -(x + (1 - s) v) / s,

and adds ``-eta^2 / 2 * score * dt`` to the Euler mean, ``dt = s_next - s < 0``:

    mean = x + v dt + eta^2 / (2 s) * (x + (1 - s) v) dt,    std = eta * sqrt(-dt).

That is Flow-GRPO's Euler-Maruyama step (``samplers.flow_sde``) with ``sigma_s = eta`` instead of
``a * sqrt(s / (1 - s))``, so the two coincide at any step where ``a * sqrt(s / (1 - s)) = eta``
(e.g. ``s = 1/2`` with ``a = eta``). No ``s = 1`` special case is needed: ``eta`` is finite there.

The log-density is the true Gaussian one, as in the reference's intended expression (some
versions of ``flux_step`` leave ``- log std - log sqrt(2 pi)`` on a separate line, i.e. drop it;
those terms do not depend on the model, so the policy ratio is the same either way).
"""

from __future__ import annotations

import torch

from samplers.base import LogProbReduction
from samplers.flow_sde import reverse_sde_coefficients
from samplers.gaussian import GaussianFlowSampler


class DanceSDESampler(GaussianFlowSampler):
    """Stochastic step with a Gaussian transition log-prob (DanceGRPO SDE, constant diffusion).

    Args:
        sigmas: ``[T + 1]`` noise levels, decreasing from 1 to 0.
        noise_level: the constant diffusion coefficient ``eta``; DanceGRPO uses 0.3. With 0 the
            step is exactly the ODE (Euler) step and its log-prob is 0.
        log_prob_reduction: ``"mean"`` over latent elements (DanceGRPO's convention) or ``"sum"``
            (the true joint log-density).
    """

    def __init__(
        self,
        sigmas: torch.Tensor,
        noise_level: float = 0.3,
        log_prob_reduction: LogProbReduction = "mean",
    ) -> None:
        super().__init__(sigmas, noise_level, log_prob_reduction)

    def _coefficient_table(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        return reverse_sde_coefficients(sigma, sigma_next, torch.full_like(sigma, self.noise_level))
