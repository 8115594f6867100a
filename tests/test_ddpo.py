"""DDPO's pieces without a model: its per-prompt stat tracker by hand, its defaults against the
released config, and the one-line refusals of the DDIM algorithms' configs."""

from __future__ import annotations

import pytest
import torch

from genrl.algorithms.ddim_grpo import DDIMGRPOConfig
from genrl.algorithms.ddpo import DDPOConfig
from genrl.config.errors import ConfigError
from genrl.objectives.ddim_policy_gradient import DDPOStatTracker
from genrl.rollouts.configs import DDIMSamplingConfig


def test_stat_tracker_by_hand() -> None:
    """buffer 4, min_count 3, eps 0.

    1: a=[1, 3], b=[5]: both buffers short -> batch mean 3, std sqrt(8/3) = 1.6329932.
    2: a=[5, 7]: buffer [1, 3, 5, 7], mean 4, std sqrt(5) = 2.2360680.
    3: a=[9]: buffer keeps the last 4, [3, 5, 7, 9], mean 6, std sqrt(5).
    """
    tracker = DDPOStatTracker(buffer_size=4, min_count=3, eps=0.0)
    first = tracker.update(["a", "a", "b"], torch.tensor([1.0, 3.0, 5.0]))
    assert torch.allclose(first, torch.tensor([-1.2247449, 0.0, 1.2247449]), atol=1e-6)
    second = tracker.update(["a", "a"], torch.tensor([5.0, 7.0]))
    assert torch.allclose(second, torch.tensor([0.4472136, 1.3416408]), atol=1e-6)
    third = tracker.update(["a"], torch.tensor([9.0]))
    assert torch.allclose(third, torch.tensor([1.3416408]), atol=1e-6)
    # Resumable: a restored tracker continues the same buffers.
    restored = DDPOStatTracker(buffer_size=4, min_count=3, eps=0.0)
    restored.load_state_dict(tracker.state_dict())
    assert list(restored.buffers["a"]) == [3.0, 5.0, 7.0, 9.0]
    # buffer_size 0: the batch's standardised rewards.
    plain = DDPOStatTracker(buffer_size=0, eps=0.0).update(["a", "b"], torch.tensor([1.0, 3.0]))
    assert torch.allclose(plain, torch.tensor([-1.0, 1.0]))


def test_defaults_are_ddpo_released_config() -> None:
    """ddpo_pytorch config/base.py: clip_range 1e-4, adv_clip_max 5, timestep_fraction 1.0,
    per-prompt buffer 16 / min_count 16; sample.num_steps 50, eta 1.0, guidance 5.0."""
    config, sampler = DDPOConfig(), DDIMSamplingConfig()
    assert (config.clip_range, config.advantage_clip, config.timestep_fraction) == (1e-4, 5.0, 1.0)
    assert (config.stat_buffer_size, config.stat_min_count, config.kl_beta) == (16, 16, 0.0)
    assert (sampler.num_steps, sampler.noise_level, sampler.guidance_scale) == (50, 1.0, 5.0)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (DDPOConfig(std_mode="global"), "algorithm.std_mode"),
        (DDPOConfig(stat_min_count=32), "stat_min_count"),
        (DDPOConfig(kl_reward=0.1), "algorithm.kl_reward"),
        (DDIMGRPOConfig(ratio_norm=True), "algorithm.ratio_norm"),
    ],
)
def test_configs_refuse_what_ddim_cannot_serve(config, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.validate()


def test_sampler_section_refuses_a_flow_shift() -> None:
    with pytest.raises(ConfigError, match=r"sampler\.shift"):
        DDIMSamplingConfig(shift=3.0).validate()
    with pytest.raises(ConfigError, match="eta"):
        DDIMSamplingConfig(noise_level=-1.0).validate()


def test_ddpo_refuses_a_flow_policy() -> None:
    from genrl.algorithms.ddpo import DDPO
    from pipelines import build_policy

    policy = build_policy("toy_digits")
    with pytest.raises(ConfigError, match="epsilon / v-prediction diffusion model"):
        DDPO(DDPOConfig(), None).build(policy)
