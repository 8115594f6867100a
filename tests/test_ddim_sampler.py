"""DDIM's stochastic step with log-probs (``samplers/ddim.py``): one step by hand, equality with
``diffusers.DDIMScheduler.step`` for the three prediction types, re-scoring, and the density."""

from __future__ import annotations

import math

import pytest
import torch
from diffusers import DDIMScheduler

from samplers import DDIMSampler, DDIMSchedule, step_with_logprob


def _schedule_of(scheduler: DDIMScheduler) -> DDIMSchedule:
    return DDIMSchedule(
        timesteps=scheduler.timesteps,
        alphas_cumprod=scheduler.alphas_cumprod,
        final_alpha_cumprod=float(scheduler.final_alpha_cumprod),
        prediction_type=scheduler.config.prediction_type,
        clip_sample=scheduler.config.clip_sample,
        clip_sample_range=scheduler.config.clip_sample_range,
    )


def _scheduler(prediction_type: str, **kwargs) -> DDIMScheduler:
    """Stable Diffusion's DDIM settings (scaled-linear betas, steps_offset 1) unless overridden."""
    config = dict(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        prediction_type=prediction_type,
    )
    scheduler = DDIMScheduler(**{**config, **kwargs})
    scheduler.set_timesteps(10)
    return scheduler


# Four training timesteps, two sampling steps: timesteps [3, 1], previous timesteps [1, -1].
TOY = DDIMSchedule(
    timesteps=torch.tensor([3, 1]),
    alphas_cumprod=torch.tensor([0.9, 0.8, 0.5, 0.2]),
    final_alpha_cumprod=0.9,
)


def test_one_step_by_hand() -> None:
    """Step 0 of TOY: a_t = 0.2, a_prev = 0.8; x = 1, eps = 0.5, z = 0.2, eta = 1.

    x0 = (1 - sqrt(0.8) * 0.5) / sqrt(0.2) = sqrt(5) - 1 = 1.2360680
    sigma^2 = (0.2 / 0.8) * (1 - 0.2 / 0.8) = 0.1875, sigma = 0.4330127
    mean = sqrt(0.8) x0 + sqrt(1 - 0.8 - 0.1875) * 0.5 = 1.1055728 + 0.0559017 = 1.1614745
    x_prev = mean + sigma z = 1.1614745 + 0.0866025 = 1.2480770
    log p = -z^2 / 2 - log sigma - log(2 pi) / 2 = -0.02 + 0.8369882 - 0.9189385 = -0.1019503
    """
    out = step_with_logprob(
        torch.full((1, 1), 0.5), 0, torch.ones(1, 1), TOY, 1.0, noise=torch.full((1, 1), 0.2)
    )
    assert out.mean.item() == pytest.approx(1.1614745, abs=1e-6)
    assert out.std.item() == pytest.approx(0.4330127, abs=1e-6)
    assert out.prev_sample.item() == pytest.approx(1.2480770, abs=1e-6)
    assert out.log_prob.item() == pytest.approx(-0.1019503, abs=1e-6)
    # v-prediction of v = 0.5 at x = 1: x0 = sqrt(.2) - sqrt(.8) / 2 = 0, eps = sqrt(.2) / 2 +
    # sqrt(.8) = 1.1180340, mean = 0 + sqrt(0.0125) * 1.1180340 = 0.125.
    v_schedule = DDIMSchedule(TOY.timesteps, TOY.alphas_cumprod, 0.9, "v_prediction")
    out = step_with_logprob(torch.full((1, 1), 0.5), 0, torch.ones(1, 1), v_schedule, 1.0)
    assert out.mean.item() == pytest.approx(0.125, abs=1e-6)
    # The last step's previous timestep is -1: a_prev is final_alpha_cumprod (0.9), a_t = 0.8.
    last = step_with_logprob(torch.zeros(1, 1), 1, torch.ones(1, 1), TOY, 0.0)
    assert last.prev_sample.item() == pytest.approx(math.sqrt(0.9 / 0.8), abs=1e-6)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize(
    "settings",
    [{}, {"set_alpha_to_one": True, "clip_sample": True}, {"timestep_spacing": "trailing"}],
)
def test_eta_zero_equals_the_scheduler_step(prediction_type: str, settings: dict) -> None:
    """Every step of a 10-step trajectory, bit for bit, including the clipped x0 and the
    final_alpha_cumprod of the last step; eta > 0 with the same noise too."""
    scheduler = _scheduler(prediction_type, **settings)
    schedule = _schedule_of(scheduler)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 8, 8, generator=generator)
    for i, t in enumerate(scheduler.timesteps):
        output = torch.randn(x.shape, generator=generator)
        expected = scheduler.step(output, t, x, eta=0.0).prev_sample
        ours = step_with_logprob(output, i, x, schedule, 0.0)
        assert torch.equal(ours.prev_sample, expected), (prediction_type, i)
        assert torch.equal(ours.log_prob, torch.zeros(2))
        z = torch.randn(x.shape, generator=generator)
        noisy = scheduler.step(output, t, x, eta=1.0, variance_noise=z).prev_sample
        assert torch.equal(
            step_with_logprob(output, i, x, schedule, 1.0, noise=z).prev_sample, noisy
        )
        x = expected


def test_rescoring_reproduces_the_sampling_log_prob() -> None:
    """Scoring the drawn ``prev_sample`` (int index, and a per-sample index as training does)
    gives back the sampling log-prob exactly."""
    sampler = DDIMSampler(_schedule_of(_scheduler("epsilon")), eta=1.0)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 8, 8, generator=generator)
    eps = torch.randn(x.shape, generator=generator)
    drawn = sampler.step(eps, 4, x, generator=generator)
    again = sampler.step(eps, 4, x, prev_sample=drawn.prev_sample)
    assert torch.equal(again.log_prob, drawn.log_prob)
    batched = sampler.step(eps, torch.tensor([4, 4, 4]), x, prev_sample=drawn.prev_sample)
    assert torch.allclose(batched.log_prob, drawn.log_prob, atol=1e-6, rtol=0)
    assert torch.equal(sampler.reference_std(torch.tensor([4, 4, 4]), x), drawn.std)


def test_log_prob_is_the_gaussian_density() -> None:
    """DDPO's log-prob: the Gaussian log-density of each element, averaged over the non-batch
    dimensions (``sum`` sums them); steps of a batch with different timesteps each get their
    own sigma_t."""
    schedule = _schedule_of(_scheduler("v_prediction"))
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 8, 8, generator=generator)
    v = torch.randn(x.shape, generator=generator)
    target = torch.randn(x.shape, generator=generator)
    index = torch.tensor([0, 7])
    out = step_with_logprob(v, index, x, schedule, 0.7, prev_sample=target)
    std = out.std.view(2, 1, 1, 1)
    density = (
        -((target - out.mean) ** 2) / (2 * std**2)
        - torch.log(std)
        - math.log(math.sqrt(2 * math.pi))
    )
    assert torch.allclose(out.log_prob, density.mean(dim=(1, 2, 3)), atol=1e-5, rtol=0)
    summed = step_with_logprob(
        v, index, x, schedule, 0.7, prev_sample=target, log_prob_reduction="sum"
    )
    assert torch.allclose(summed.log_prob, density.sum(dim=(1, 2, 3)), rtol=1e-5)
    alpha_t, alpha_prev = schedule.alphas()
    sigma = 0.7 * (((1 - alpha_prev) / (1 - alpha_t)) * (1 - alpha_t / alpha_prev)).sqrt()
    assert torch.allclose(out.std, sigma[index], rtol=1e-6)


def test_a_step_without_noise_has_log_prob_zero() -> None:
    """With set_alpha_to_one the last step reaches a_prev = 1, where sigma_t = 0: its log-prob
    is exactly 0 (no density) and finite, mixed in one batch with a random step."""
    sampler = DDIMSampler(_schedule_of(_scheduler("epsilon", set_alpha_to_one=True)), eta=1.0)
    assert sampler.stochastic_steps.tolist() == [True] * 9 + [False]
    x = torch.randn(2, 4, 4, 4)
    out = sampler.step(
        torch.randn_like(x), torch.tensor([9, 3]), x, prev_sample=torch.randn_like(x)
    )
    assert out.log_prob[0] == 0 and out.log_prob[1] != 0 and torch.isfinite(out.log_prob).all()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="prediction_type"):
        DDIMSchedule(TOY.timesteps, TOY.alphas_cumprod, 0.9, "flow")
    with pytest.raises(ValueError, match="eta"):
        step_with_logprob(torch.zeros(1, 1), 0, torch.zeros(1, 1), TOY, -1.0)
    with pytest.raises(IndexError):
        step_with_logprob(torch.zeros(1, 1), 2, torch.zeros(1, 1), TOY, 1.0)
