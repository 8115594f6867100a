"""One Gaussian step shared by the stochastic flow samplers; each supplies only its coefficients.

Flow-GRPO's SDE (Liu et al. 2025, eq. 9-10), DanceGRPO's SDE (Xue et al. 2025) and
coefficients-preserving sampling (Wang & Yu 2025) all move a flow-matching state ``x`` at noise
level ``s = sigmas[i]`` to ``s_next = sigmas[i + 1]`` with a Gaussian whose mean is linear in ``x``
and in the model's velocity ``v``, with weights that depend on the step alone:

    x_next ~ N(c_x[i] * x + c_v[i] * v, std[i]^2 I).

A sampler hands over the ``[3, T]`` table ``(c_x, c_v, std)``; this class does the rest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from samplers.base import (
    LOG_PROB_REDUCTIONS,
    LogProbReduction,
    StepOutput,
    check_sigmas,
    gaussian_log_prob,
    per_sample,
)


class GaussianFlowSampler(ABC):
    """Draws and re-scores ``x_next ~ N(c_x x + c_v v, std^2 I)`` from a per-step table.

    The table is computed once, in float32, when the sampler is built. Rollouts (int index) and
    training (``[B]`` tensor index) read the same numbers, so re-scoring a stored sample reproduces
    its sampling log-prob bit for bit. A step whose std is 0 is deterministic: it returns the mean
    (or the given ``prev_sample``) and a log-prob of exactly 0, since it has no density to train.

    Args:
        sigmas: ``[T + 1]`` noise levels, decreasing from 1 to 0.
        noise_level: the subclass's noise knob; 0 makes every step deterministic.
        log_prob_reduction: ``"mean"`` over latent elements (Flow-GRPO's and DanceGRPO's
            convention, which is why their clip ranges are ~1e-4) or ``"sum"`` (the true joint
            log-density).
    """

    stochastic = True

    def __init__(
        self,
        sigmas: torch.Tensor,
        noise_level: float,
        log_prob_reduction: LogProbReduction = "mean",
    ) -> None:
        if not noise_level >= 0:  # also rejects NaN
            raise ValueError(f"noise_level must be >= 0, got {noise_level}")
        if log_prob_reduction not in LOG_PROB_REDUCTIONS:
            raise ValueError(
                f"log_prob_reduction must be one of {LOG_PROB_REDUCTIONS}, got {log_prob_reduction!r}"
            )
        self.sigmas = check_sigmas(sigmas)
        self.noise_level = float(noise_level)
        self.log_prob_reduction: LogProbReduction = log_prob_reduction
        table = self._coefficient_table(self.sigmas[:-1], self.sigmas[1:])
        if table.shape != (3, self.num_steps) or table.dtype != torch.float32:
            raise TypeError(
                f"{type(self).__name__}._coefficient_table must return a float32 [3, "
                f"{self.num_steps}] tensor, got {table.dtype} {tuple(table.shape)}"
            )
        if not bool(torch.isfinite(table).all()) or bool((table[2] < 0).any()):
            raise ValueError(
                f"{type(self).__name__} coefficients are not finite or have a negative std for "
                f"noise_level={noise_level} and these sigmas"
            )
        self._coefficients = table  # [3, T]: sample coefficient, velocity coefficient, std
        self._reference_std = self._reference_std_table(self.sigmas[:-1], self.sigmas[1:])
        # A Python copy of which steps are random, so that an int-index step (the rollout loop)
        # can skip the log-density of a deterministic step without reading a device tensor.
        self._random_step: list[bool] = (table[2] > 0).tolist()
        self._on_device: dict[torch.device, torch.Tensor] = {}

    @abstractmethod
    def _coefficient_table(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        """``[3, T]`` float32 stack of (sample coefficient, velocity coefficient, std) per step.

        ``sigma`` and ``sigma_next`` are ``sigmas[:-1]`` and ``sigmas[1:]``; ``self.sigmas`` and
        ``self.noise_level`` are already set.
        """

    def _reference_std_table(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        """``[T]``: the per-step std that the sampler's reference implementation returns as
        ``std_dev_t`` (what its KL divides by); by default the transition std itself."""
        del sigma, sigma_next
        return self._coefficients[2]

    def reference_std(self, timestep_index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``[B]`` reference ``std_dev_t`` of each sample's step (see ``_reference_std_table``)."""
        index = torch.as_tensor(timestep_index, device=like.device, dtype=torch.long)
        return self._reference_std.to(like.device)[index].expand(like.shape[0])

    @property
    def num_steps(self) -> int:
        return self.sigmas.numel() - 1

    @property
    def stochastic_steps(self) -> torch.Tensor:
        """``[T]`` bool: True where the step's std is > 0, i.e. where a policy ratio exists."""
        return self._coefficients[2] > 0

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

    def _log_prob(
        self,
        value: torch.Tensor,
        mean: torch.Tensor,
        std: torch.Tensor,
        timestep_index: int | torch.Tensor,
    ) -> torch.Tensor:
        """``[B]`` log-density, exactly 0 (never NaN, no gradient) where ``std == 0``."""
        zeros = torch.zeros(value.shape[0], device=value.device)
        if isinstance(timestep_index, int):
            if not self._random_step[timestep_index]:
                return zeros
            return gaussian_log_prob(value, mean, std, self.log_prob_reduction)
        # Per-sample indices may mix random and deterministic steps (e.g. CPS's last step). Divide
        # by 1 where std is 0 so that neither the value nor its gradient is NaN, then mask.
        random = std > 0
        safe_std = torch.where(random, std, torch.ones_like(std))
        log_prob = gaussian_log_prob(value, mean, safe_std, self.log_prob_reduction)
        return torch.where(random.flatten(), log_prob, zeros)

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
        """One step; re-scores ``prev_sample`` when given, else samples it.

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
                # Drawn even on deterministic steps, so the generator's stream does not depend
                # on which steps are random.
                noise = torch.randn(
                    sample.shape, generator=generator, device=sample.device, dtype=sample.dtype
                )
            prev_sample = mean + std * noise.float()
        else:
            prev_sample = prev_sample.float()

        log_prob = self._log_prob(prev_sample.detach(), mean, std, timestep_index)
        return StepOutput(
            prev_sample=prev_sample,
            log_prob=log_prob,
            mean=mean,
            # clone(): with an int index ``std`` is a view into the cached table, which a caller's
            # in-place edit of the output would otherwise corrupt.
            std=std.flatten().expand(sample.shape[0]).clone(),
        )
