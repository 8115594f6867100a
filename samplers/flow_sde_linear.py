"""Flow-GRPO's Wan sampler: the reverse SDE of ``samplers.flow_sde`` with a diffusion coefficient
linear in the noise level.

Flow-GRPO's Wan 2.1 code (``flow_grpo/diffusers_patch/wan_pipeline_with_logprob.py``,
``sde_step_with_logprob``, added in the upstream commit 11caf1b "wan2_1") keeps the drift of
Flow-GRPO eq. 9-10 and replaces ``sigma_s = a * sqrt(s / (1 - s))`` by

    sigma_s = sigma_min + (sigma_max - sigma_min) * s,

with ``sigma_max`` the schedule's second level and ``sigma_min`` its last (0 for a schedule that
ends at 0), so ``sigma_s`` is about ``s`` itself: no ``s = 1`` singularity and less noise near
the end. Its transition std is ``sigma_s * sqrt(-dt)``, which its KL term divides by too (the
default ``reference_std``). ``noise_level`` scales ``sigma_s``: 1.0 is the reference.
"""

from __future__ import annotations

import torch

from samplers.base import LogProbReduction
from samplers.flow_sde import reverse_sde_coefficients
from samplers.gaussian import GaussianFlowSampler


class FlowSDELinearSampler(GaussianFlowSampler):
    """Stochastic step with a Gaussian transition log-prob (Flow-GRPO's Wan SDE).

    Args:
        sigmas: ``[T + 1]`` noise levels, decreasing from 1 to 0.
        noise_level: factor on ``sigma_s = sigmas[-1] + (sigmas[1] - sigmas[-1]) * s``; 1.0 is
            Flow-GRPO's Wan setting. With 0 the step is the ODE (Euler) step, log-prob 0.
        log_prob_reduction: ``"mean"`` over latent elements (the reference's) or ``"sum"``.
    """

    def __init__(
        self,
        sigmas: torch.Tensor,
        noise_level: float = 1.0,
        log_prob_reduction: LogProbReduction = "mean",
    ) -> None:
        super().__init__(sigmas, noise_level, log_prob_reduction)

    def diffusion_coefficient(self, sigma: torch.Tensor) -> torch.Tensor:
        """``noise_level * (sigma_min + (sigma_max - sigma_min) * s)``."""
        low, high = self.sigmas[-1].to(sigma.device), self.sigmas[1].to(sigma.device)
        return self.noise_level * (low + (high - low) * sigma)

    def _coefficient_table(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        return reverse_sde_coefficients(sigma, sigma_next, self.diffusion_coefficient(sigma))
