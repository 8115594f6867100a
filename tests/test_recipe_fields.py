"""Real-model recipes carry their reference's settings: the values pinned here are the ones
checked field by field against each recipe's cited source (files and line numbers in the recipe
docstrings). ``tests/test_flow_adapter_options.py`` tests the adapter options they set."""

from __future__ import annotations

import pytest

from genrl import get_recipe
from genrl.recipes.images import FLOW_GRPO_FLUX_LORA_TARGETS, FLOW_GRPO_SD3_LORA_TARGETS


@pytest.mark.parametrize("name", ["sd35m_pickscore", "sd35m_imagereward"])
def test_sd35m_flow_grpo_recipes_follow_pickscore_sd3(name: str) -> None:
    """config/grpo.py pickscore_sd3 + config/base.py + scripts/train_sd3.py (flow_grpo 9745241)."""
    config = get_recipe(name)
    kwargs = config.policy.kwargs
    assert kwargs["max_sequence_length"] == 128  # not the pipeline's 256
    assert kwargs["lora_init"] == "gaussian"
    assert kwargs["detach_uncond"] is False  # train_sd3.py trains both CFG branches
    assert (kwargs["height"], kwargs["width"]) == (512, 512)
    assert config.policy.lora_target_modules == FLOW_GRPO_SD3_LORA_TARGETS
    assert (config.policy.lora_rank, config.policy.lora_alpha) == (32, 64)
    assert config.algorithm.kl_beta == 0.01  # the reference's beta, with its own KL form
    assert config.algorithm.kl_form == "flow_grpo"
    assert config.algorithm.std_mode == "global"
    assert config.algorithm.clip_range == 1e-4
    assert config.algorithm.advantage_clip == 5.0
    assert config.algorithm.timestep_fraction == 0.99
    assert config.train.mixed_precision == "fp16"  # config/base.py
    assert (config.train.prompts_per_iteration, config.train.group_size) == (48, 24)
    s = config.sampler
    assert (s.num_steps, s.noise_level, s.guidance_scale) == (10, 0.7, 4.5)
    o = config.optim
    assert (o.lr, o.weight_decay, o.betas, o.max_grad_norm) == (3e-4, 1e-4, [0.9, 0.999], 1.0)
    assert (o.ema_decay, o.ema_every) == (0.9, 8)
    assert (s.eval_num_steps, config.eval.every, config.eval.batch_size) == (40, 60, 16)


def test_sd35m_fast_and_sana_recipes() -> None:
    fast = get_recipe("sd35m_pickscore_fast")
    assert fast.policy.kwargs["max_sequence_length"] == 128
    assert fast.algorithm.kl_beta == 0.0 and fast.algorithm.clip_range == 1e-5
    assert (fast.sampler.name, fast.sampler.noise_level, fast.sampler.sde_window_size) == (
        "flow_cps",
        0.8,
        3,
    )
    assert fast.train.mixed_precision == "fp16"
    sana = get_recipe("sana_clipscore")
    assert sana.algorithm.kl_beta == 0.02  # clipscore_sd3
    assert sana.sampler.same_initial_noise
    assert "max_sequence_length" not in sana.policy.kwargs  # Gemma at the pipeline's 300
    assert sana.policy.lora_target_modules is None


def test_flux_recipes_follow_pickscore_flux() -> None:
    """config/grpo.py pickscore_flux + scripts/train_flux.py."""
    config = get_recipe("flux_dev_pickscore")
    assert config.policy.kwargs["max_sequence_length"] == 128  # not the pipeline's 512
    assert config.policy.kwargs["lora_init"] == "gaussian"
    assert (config.policy.lora_rank, config.policy.lora_alpha) == (64, 128)
    assert config.policy.lora_target_modules == FLOW_GRPO_FLUX_LORA_TARGETS
    assert config.algorithm.drop_zero_advantages is False
    assert config.algorithm.kl_beta == 0.0
    assert (config.sampler.num_steps, config.sampler.noise_level) == (6, 0.9)
    assert config.train.mixed_precision == "bf16"
    assert (config.train.minibatch_size, config.train.gradient_accumulation_steps) == (3, 120)
    assert (config.eval.every, config.sampler.eval_num_steps, config.logging.checkpoint_every) == (
        30,
        28,
        30,
    )
    assert get_recipe("flux_dev_hps").policy == config.policy
    # BranchGRPO's FLUX embeddings use the pipeline's 512 tokens; GDRO keeps the paper's r32.
    assert "max_sequence_length" not in get_recipe("flux_dev_hps_branch").policy.kwargs
    gdro = get_recipe("flux_dev_hps_gdro")
    assert (gdro.policy.lora_rank, gdro.policy.lora_target_modules) == (32, None)


def test_regression_recipes_inherit_the_sd3_text_length() -> None:
    nft = get_recipe("sd35m_pickscore_nft")
    assert nft.policy.kwargs["max_sequence_length"] == 128  # train_nft_sd3.py
    assert nft.train.mixed_precision == "fp16"
    assert (nft.eval.every, nft.logging.checkpoint_every) == (10, 30)
    assert (nft.optim.ema_decay, nft.optim.ema_every) == (0.9, 1)
    assert get_recipe("sd35m_pickscore_ram").policy.kwargs["max_sequence_length"] == 128


def test_llada_recipe_follows_maskgrpo_t2t() -> None:
    """MaskGRPO b74ba3c: scripts/train/t2t_grpo_train.sh, configs/rl.yaml, grpo_config.py."""
    config = get_recipe("llada8b_countdown_maskgrpo")
    assert config.generation.temperature == 0.9  # grpo_config.py default, not overridden
    assert config.algorithm.aggregation == "bnpo"
    assert config.algorithm.std_eps == 1e-5 and config.algorithm.std_estimator == "sample"
    assert config.algorithm.kl_beta == 0.01 and config.algorithm.clip_range == 0.2
    assert config.policy.lora_target_modules == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "up_proj",
        "down_proj",
        "gate_proj",
    ]
    assert config.train.iterations * 12 >= 8000  # max_steps, 12 optimizer steps per rollout


def test_qwen3_recipe_uses_trl_default_schedule() -> None:
    config = get_recipe("qwen3_countdown_grpo")
    assert config.optim.lr_schedule == "linear" and config.optim.warmup_steps == 0
    assert config.algorithm.kl_beta == 0.0 and config.algorithm.aggregation == "token_mean"
