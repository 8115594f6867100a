"""Flow-GRPO's stochastic sampler: the reverse-time SDE of a flow-matching model.

Liu et al., "Flow-GRPO: Training Flow Matching Models via Online RL" (2025), eq. 9-10: the ODE
``dx = v ds`` is turned into an SDE with the same marginals,

    dx = [v + sigma_s^2 / (2 s) * (x + (1 - s) v)] ds + sigma_s dW,   sigma_s = a * sqrt(s / (1 - s)),

whose Euler-Maruyama step (``dt = s_next - s < 0``) is the Gaussian

    mean = x * (1 + sigma_s^2 / (2 s) * dt) + v * (1 + sigma_s^2 (1 - s) / (2 s)) * dt
    x_next ~ N(mean, (sigma_s * sqrt(-dt))^2).

At ``s = 1`` the schedule's second level replaces ``s`` inside ``1 - s`` to avoid dividing by
zero, as the Flow-GRPO reference implementation does.
"""

from __future__ import annotations

import torch

from samplers.base import LogProbReduction
from samplers.gaussian import GaussianFlowSampler


def reverse_sde_coefficients(
    sigma: torch.Tensor, sigma_next: torch.Tensor, diffusion: torch.Tensor
) -> torch.Tensor:
    """``[3, T]`` Euler-Maruyama coefficients of the SDE above for a diffusion ``sigma_s`` per step.

    Shared by Flow-GRPO (``sigma_s = a sqrt(s / (1 - s))``) and DanceGRPO (``sigma_s = eta``): the
    drift is the same, only the diffusion coefficient differs.
    """
    dt = sigma_next - sigma
    g2_over_2s = diffusion.square() / (2 * sigma)
    return torch.stack(
        [1 + g2_over_2s * dt, (1 + g2_over_2s * (1 - sigma)) * dt, diffusion * torch.sqrt(-dt)]
    )


class FlowSDESampler(GaussianFlowSampler):
    """Stochastic step with a Gaussian transition log-prob (Flow-GRPO SDE).

    Args:
        sigmas: ``[T + 1]`` noise levels, decreasing from 1 to 0.
        noise_level: ``a`` in ``sigma_s = a * sqrt(s / (1 - s))``; Flow-GRPO uses 0.7. With 0 the
            step is exactly the ODE (Euler) step and its log-prob is 0.
        log_prob_reduction: ``"mean"`` over latent elements (Flow-GRPO's convention, which is
            why its clip ranges are ~1e-4) or ``"sum"`` (the true joint log-density).
    """

    def __init__(
        self,
        sigmas: torch.Tensor,
        noise_level: float = 0.7,
        log_prob_reduction: LogProbReduction = "mean",
    ) -> None:
        super().__init__(sigmas, noise_level, log_prob_reduction)

    def diffusion_coefficient(self, sigma: torch.Tensor) -> torch.Tensor:
        """``sigma_s = a * sqrt(s / (1 - s))`` with ``s = 1`` replaced by the second level below."""
        safe = torch.where(sigma >= 1.0, self.sigmas[1].to(sigma.device), sigma)
        return self.noise_level * torch.sqrt(sigma / (1 - safe))

    def _coefficient_table(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        return reverse_sde_coefficients(sigma, sigma_next, self.diffusion_coefficient(sigma))

    def _reference_std_table(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        """The diffusion coefficient ``sigma_s`` without ``sqrt(-dt)``: what Flow-GRPO's
        ``sde_step_with_logprob`` returns as ``std_dev_t`` (since its commit 2d76907) and its
        ``train_sd3.py`` KL divides by."""
        del sigma_next
        return self.diffusion_coefficient(sigma)
