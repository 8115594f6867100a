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

from samplers.base import (
    LOG_PROB_REDUCTIONS,
    LogProbReduction,
    StepOutput,
    gaussian_log_prob,
    per_sample,
)
from samplers.flow_ode import _check_sigmas


class FlowSDESampler:
    """Stochastic step with a Gaussian transition log-prob (Flow-GRPO SDE).

    Args:
        sigmas: ``[T + 1]`` noise levels, decreasing from 1 to 0.
        noise_level: ``a`` in ``sigma_s = a * sqrt(s / (1 - s))``; Flow-GRPO uses 0.7. With 0 the
            step is exactly the ODE (Euler) step and its log-prob is 0.
        log_prob_reduction: ``"mean"`` over latent elements (Flow-GRPO's convention, which is
            why its clip ranges are ~1e-4) or ``"sum"`` (the true joint log-density).
    """

    stochastic = True

    def __init__(
        self,
        sigmas: torch.Tensor,
        noise_level: float = 0.7,
        log_prob_reduction: LogProbReduction = "mean",
    ) -> None:
        if noise_level < 0:
            raise ValueError(f"noise_level must be >= 0, got {noise_level}")
        if log_prob_reduction not in LOG_PROB_REDUCTIONS:
            raise ValueError(
                f"log_prob_reduction must be one of {LOG_PROB_REDUCTIONS}, got {log_prob_reduction!r}"
            )
        self.sigmas = _check_sigmas(sigmas)
        self.noise_level = float(noise_level)
        self.log_prob_reduction: LogProbReduction = log_prob_reduction
        # Per-step constants, computed once: a step is then two multiply-adds plus the
        # log-density. Rollouts (int index) and training (tensor index) read the same numbers,
        # so re-scoring reproduces the sampling log-prob bit for bit.
        s, s_next = self.sigmas[:-1], self.sigmas[1:]
        dt = s_next - s
        g = self.diffusion_coefficient(s)
        g2_over_2s = g.square() / (2 * s)
        self._coefficients = torch.stack(
            [1 + g2_over_2s * dt, (1 + g2_over_2s * (1 - s)) * dt, g * torch.sqrt(-dt)]
        )  # [3, T]: sample coefficient, velocity coefficient, transition std
        self._on_device: dict[torch.device, torch.Tensor] = {}

    @property
    def num_steps(self) -> int:
        return self.sigmas.numel() - 1

    def diffusion_coefficient(self, sigma: torch.Tensor) -> torch.Tensor:
        """``sigma_s = a * sqrt(s / (1 - s))`` with ``s = 1`` replaced by the second level below."""
        safe = torch.where(sigma >= 1.0, self.sigmas[1].to(sigma.device), sigma)
        return self.noise_level * torch.sqrt(sigma / (1 - safe))

    def _step_coefficients(
        self, timestep_index: int | torch.Tensor, sample: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sample coefficient, velocity coefficient, std), each broadcastable to ``sample``."""
        table = self._on_device.get(sample.device)
        if table is None:
            table = self._on_device[sample.device] = self._coefficients.to(sample.device)
        if isinstance(timestep_index, int):
            # Python-side range check: no device synchronisation in the rollout loop.
            if not 0 <= timestep_index < self.num_steps:
                raise IndexError(
                    f"timestep_index out of range [0, {self.num_steps - 1}]: {timestep_index}"
                )
            x_coef, v_coef, std = table[:, timestep_index]
            return x_coef, v_coef, std
        index = torch.as_tensor(timestep_index, device=sample.device, dtype=torch.long)
        if bool((index < 0).any()) or bool((index >= self.num_steps).any()):
            raise IndexError(
                f"timestep_index out of range [0, {self.num_steps - 1}]: {timestep_index}"
            )
        x_coef, v_coef, std = (per_sample(row[index], sample) for row in table)
        return x_coef, v_coef, std

    def step(
        self,
        model_output: torch.Tensor,
        timestep_index: int | torch.Tensor,
        sample: torch.Tensor,
        *,
        prev_sample: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
    ) -> StepOutput:
        """One SDE step; re-scores ``prev_sample`` when given, else samples it.

        Args:
            model_output: velocity ``v``, ``[B, *event]``.
            timestep_index: step index ``i`` (moves ``sigmas[i] -> sigmas[i+1]``), an int or a
                ``[B]`` long tensor (one index per sample, for training on shuffled timesteps).
            sample: current state ``x_s``, ``[B, *event]``.
            prev_sample: the state to score; when None a new one is drawn.
            generator: random generator for the draw (ignored when ``noise`` is given).
            noise: standard-normal noise ``[B, *event]`` to use for the draw, so that callers can
                make the draw independent of how a batch is split across processes.
        """
        sample = sample.float()
        x_coef, v_coef, std = self._step_coefficients(timestep_index, sample)
        mean = sample * x_coef + model_output.float() * v_coef

        if prev_sample is None:
            if noise is None:
                noise = torch.randn(
                    sample.shape, generator=generator, device=sample.device, dtype=sample.dtype
                )
            prev_sample = mean + std * noise.float()
        else:
            prev_sample = prev_sample.float()

        if self.noise_level == 0:
            log_prob = torch.zeros(sample.shape[0], device=sample.device)
        else:
            log_prob = gaussian_log_prob(prev_sample.detach(), mean, std, self.log_prob_reduction)
        return StepOutput(
            prev_sample=prev_sample,
            log_prob=log_prob,
            mean=mean,
            std=std.flatten().expand(sample.shape[0]),
        )
