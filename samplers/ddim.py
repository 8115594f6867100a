"""DDIM's stochastic step with its Gaussian log-probability: DDPO's sampler for epsilon-,
v- and sample-prediction diffusion models (Stable Diffusion 1.x / 2.x, SDXL).

Song et al., "Denoising Diffusion Implicit Models" (ICLR 2021), eq. 12: with ``a_t`` the
cumulative product of the alphas at timestep ``t`` (diffusers' ``alphas_cumprod``), ``a_prev``
the one ``num_train_timesteps // num_inference_steps`` timesteps earlier, the predicted clean
sample ``x0`` and noise ``eps`` of the model at ``x_t``,

    x_prev = sqrt(a_prev) x0 + sqrt(1 - a_prev - sigma_t^2) eps + sigma_t z,   z ~ N(0, I),

and eq. 16, the noise of the step,

    sigma_t = eta * sqrt((1 - a_prev) / (1 - a_t)) * sqrt(1 - a_t / a_prev),

so that every step is the Gaussian ``N(mean, sigma_t^2 I)``; eta = 0 is deterministic DDIM,
eta = 1 DDPM's posterior variance. Black et al., "Training Diffusion Models with
Reinforcement Learning" (DDPO, 2023), sample with this step and score each transition by its
log-density, averaged over the latent's elements (``ddpo_pytorch/diffusers_patch/
ddim_with_logprob.py``), which is ``log_prob_reduction="mean"`` here.

The arithmetic follows ``diffusers.DDIMScheduler.step`` operation by operation, so that with
eta = 0 a step equals the scheduler's bit for bit; the scheduler itself is not needed: its
timesteps and ``alphas_cumprod`` come in as tensors (``DDIMSchedule``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from samplers.base import (
    LOG_PROB_REDUCTIONS,
    LogProbReduction,
    StepOutput,
    gaussian_log_prob,
    per_sample,
)

PredictionType = Literal["epsilon", "v_prediction", "sample"]
PREDICTION_TYPES: tuple[str, ...] = ("epsilon", "v_prediction", "sample")


@dataclass(frozen=True)
class DDIMSchedule:
    """What a DDIM step reads from a configured ``diffusers.DDIMScheduler``, as tensors.

    Attributes:
        timesteps: ``[T]`` long, the scheduler's ``timesteps`` after ``set_timesteps(T)``, from
            the noisiest down.
        alphas_cumprod: ``[K]`` float32, the scheduler's ``alphas_cumprod`` over its
            ``K = num_train_timesteps`` training timesteps.
        final_alpha_cumprod: ``a_prev`` of a step whose previous timestep is below 0 (the
            scheduler's ``final_alpha_cumprod``: 1 with ``set_alpha_to_one``, else
            ``alphas_cumprod[0]``).
        prediction_type: what the model predicts: ``epsilon``, ``v_prediction`` or ``sample``.
        clip_sample: clamp the predicted ``x0`` to ``[-clip_sample_range, clip_sample_range]``
            (the scheduler's ``clip_sample``; False for Stable Diffusion).
        clip_sample_range: the clamp's bound.
    """

    timesteps: torch.Tensor
    alphas_cumprod: torch.Tensor
    final_alpha_cumprod: float
    prediction_type: str = "epsilon"
    clip_sample: bool = False
    clip_sample_range: float = 1.0

    def __post_init__(self) -> None:
        if self.prediction_type not in PREDICTION_TYPES:
            raise ValueError(
                f"prediction_type must be one of {PREDICTION_TYPES}, got {self.prediction_type!r}"
            )
        if self.timesteps.ndim != 1 or self.timesteps.numel() < 1:
            raise ValueError(f"timesteps must be a 1-D tensor, got {tuple(self.timesteps.shape)}")

    @property
    def num_steps(self) -> int:
        return self.timesteps.numel()

    @property
    def num_train_timesteps(self) -> int:
        return self.alphas_cumprod.numel()

    @property
    def prev_timesteps(self) -> torch.Tensor:
        """``[T]``: ``t - num_train_timesteps // num_steps``, diffusers' previous timestep (not
        the next entry of ``timesteps``, which differs under ``trailing`` spacing)."""
        return self.timesteps - self.num_train_timesteps // self.num_steps

    def alphas(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``([T], [T])`` float32 ``a_t`` and ``a_prev`` of every step."""
        cumprod = self.alphas_cumprod.float()
        prev = self.prev_timesteps
        alpha_t = cumprod[self.timesteps.long()]
        final = torch.tensor(float(self.final_alpha_cumprod), dtype=torch.float32)
        alpha_prev = torch.where(prev >= 0, cumprod[prev.clamp(min=0).long()], final)
        return alpha_t, alpha_prev


def step_with_logprob(
    model_output: torch.Tensor,
    timestep_index: int | torch.Tensor,
    sample: torch.Tensor,
    schedule: DDIMSchedule,
    eta: float,
    *,
    prev_sample: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    log_prob_reduction: LogProbReduction = "mean",
) -> StepOutput:
    """One DDIM step (module docstring); re-scores ``prev_sample`` when given, else draws it.

    Args:
        model_output: the model's prediction at ``sample`` (``schedule.prediction_type``),
            ``[B, *event]``.
        timestep_index: index ``i`` into ``schedule.timesteps``: an int, or ``[B]`` long (one
            step per sample, for training on shuffled timesteps as DDPO does).
        sample: the current latents ``x_t``, ``[B, *event]``.
        schedule: the scheduler's timesteps and alphas.
        eta: DDIM's ``eta`` (0: deterministic; DDPO: 1).
        prev_sample: the ``x_prev`` to score; None draws one.
        noise: standard-normal ``z`` for the draw (else drawn with ``generator``).
        log_prob_reduction: ``mean`` over the event's elements (DDPO) or ``sum``.

    Returns:
        ``StepOutput``: ``x_prev`` (float32), its log-density ``[B]`` (exactly 0 where
        ``sigma_t = 0``: a deterministic step has no density), the mean and ``sigma_t`` ``[B]``.
    """
    if not eta >= 0:  # also rejects NaN
        raise ValueError(f"eta must be >= 0, got {eta}")
    if log_prob_reduction not in LOG_PROB_REDUCTIONS:
        raise ValueError(
            f"log_prob_reduction must be one of {LOG_PROB_REDUCTIONS}, got {log_prob_reduction!r}"
        )
    sample = sample.float()
    model_output = model_output.float()
    alpha_t_all, alpha_prev_all = (a.to(sample.device) for a in schedule.alphas())
    if isinstance(timestep_index, int):
        if not 0 <= timestep_index < schedule.num_steps:
            raise IndexError(
                f"timestep_index out of range [0, {schedule.num_steps - 1}]: {timestep_index}"
            )
        # 0-dim, as the scheduler's own scalars: the same float32 operations, bit for bit.
        alpha_prod_t = alpha_t_all[timestep_index]
        alpha_prod_t_prev = alpha_prev_all[timestep_index]
    else:
        index = torch.as_tensor(timestep_index, device=sample.device, dtype=torch.long)
        alpha_prod_t = per_sample(alpha_t_all[index], sample)
        alpha_prod_t_prev = per_sample(alpha_prev_all[index], sample)
    beta_prod_t = 1 - alpha_prod_t

    # Eq. 12's "predicted x0" and the noise it implies, for each parametrisation.
    if schedule.prediction_type == "epsilon":
        pred_original_sample = (sample - beta_prod_t ** (0.5) * model_output) / alpha_prod_t ** (
            0.5
        )
        pred_epsilon = model_output
    elif schedule.prediction_type == "sample":
        pred_original_sample = model_output
        pred_epsilon = (sample - alpha_prod_t ** (0.5) * pred_original_sample) / beta_prod_t ** (
            0.5
        )
    else:  # v_prediction (Salimans & Ho 2022): v = sqrt(a) eps - sqrt(1 - a) x0
        pred_original_sample = (alpha_prod_t**0.5) * sample - (beta_prod_t**0.5) * model_output
        pred_epsilon = (alpha_prod_t**0.5) * model_output + (beta_prod_t**0.5) * sample
    if schedule.clip_sample:
        pred_original_sample = pred_original_sample.clamp(
            -schedule.clip_sample_range, schedule.clip_sample_range
        )

    # Eq. 16: sigma_t(eta).
    beta_prod_t_prev = 1 - alpha_prod_t_prev
    variance = (beta_prod_t_prev / beta_prod_t) * (1 - alpha_prod_t / alpha_prod_t_prev)
    std_dev_t = eta * variance ** (0.5)
    pred_sample_direction = (1 - alpha_prod_t_prev - std_dev_t**2) ** (0.5) * pred_epsilon
    mean = alpha_prod_t_prev ** (0.5) * pred_original_sample + pred_sample_direction

    std = torch.as_tensor(std_dev_t, dtype=torch.float32, device=sample.device)
    std = std.reshape(-1, *([1] * (sample.ndim - 1))) if std.ndim else per_sample(std, sample)
    if prev_sample is None:
        if noise is None:
            noise = torch.randn(
                sample.shape, generator=generator, device=sample.device, dtype=sample.dtype
            )
        # No noise term at all for eta = 0, as the scheduler (adding 0 * z would still be exact
        # but costs a pass over the latents).
        prev_sample = mean + std * noise.float() if eta > 0 else mean
    else:
        prev_sample = prev_sample.float()

    random = std > 0
    zeros = torch.zeros(sample.shape[0], device=sample.device)
    if not bool(random.any()):
        log_prob = zeros
    else:
        # Divide by 1 where sigma_t = 0 (DDIM's step to a_prev = 1 with set_alpha_to_one) so
        # that neither the value nor its gradient is NaN, then mask.
        safe = torch.where(random, std, torch.ones_like(std))
        log_prob = gaussian_log_prob(prev_sample.detach(), mean, safe, log_prob_reduction)
        log_prob = torch.where(random.flatten(), log_prob, zeros)
    return StepOutput(
        prev_sample=prev_sample,
        log_prob=log_prob,
        mean=mean,
        std=std.flatten().expand(sample.shape[0]).clone(),
    )


class DDIMSampler:
    """``step_with_logprob`` bound to a schedule, ``eta`` and a reduction, with the members the
    step-wise objectives read (``num_steps``, ``stochastic_steps``, ``reference_std``).

    Args:
        schedule: the scheduler's timesteps and alphas.
        eta: DDIM's ``eta`` (DDPO: 1.0).
        log_prob_reduction: ``mean`` over latent elements (DDPO) or ``sum``.
    """

    stochastic = True

    def __init__(
        self,
        schedule: DDIMSchedule,
        eta: float = 1.0,
        log_prob_reduction: LogProbReduction = "mean",
    ) -> None:
        if not eta >= 0:
            raise ValueError(f"eta must be >= 0, got {eta}")
        self.schedule = schedule
        self.eta = float(eta)
        self.log_prob_reduction: LogProbReduction = log_prob_reduction
        alpha_t, alpha_prev = schedule.alphas()
        variance = ((1 - alpha_prev) / (1 - alpha_t)) * (1 - alpha_t / alpha_prev)
        self._std = self.eta * variance**0.5  # [T] sigma_t of eq. 16

    @property
    def num_steps(self) -> int:
        return self.schedule.num_steps

    @property
    def timesteps(self) -> torch.Tensor:
        """``[T]`` the model's timestep input of each step."""
        return self.schedule.timesteps

    @property
    def stochastic_steps(self) -> torch.Tensor:
        """``[T]`` bool: steps with ``sigma_t > 0`` (all of them for eta > 0 unless the last
        step reaches ``a_prev = 1``)."""
        return self._std > 0

    def reference_std(self, timestep_index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``[B]`` ``sigma_t`` of each sample's step (what a KL on the means divides by)."""
        index = torch.as_tensor(timestep_index, device=like.device, dtype=torch.long)
        return self._std.to(like.device)[index].expand(like.shape[0])

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
        """One step (``step_with_logprob``); the samplers' shared step contract."""
        return step_with_logprob(
            model_output,
            timestep_index,
            sample,
            self.schedule,
            self.eta,
            prev_sample=prev_sample,
            noise=noise,
            generator=generator,
            log_prob_reduction=self.log_prob_reduction,
        )


__all__ = ["PREDICTION_TYPES", "DDIMSampler", "DDIMSchedule", "step_with_logprob"]
