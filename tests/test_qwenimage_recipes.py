"""The Qwen-Image recipes (genrl/recipes/qwenimage.py): the values pinned here are the ones read
field by field from Flow-GRPO's ``pickscore_qwenimage`` and verl-omni's
``run_qwen_image_ocr_lora.sh`` (see the recipe docstrings), and the OCR recipe runs an iteration
on a tiny Qwen-Image and a tiny OCR reader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from genrl import get_recipe
from genrl.recipes.qwenimage import VERL_OMNI_QWEN_LORA_TARGETS


def test_qwenimage_pickscore_follows_flow_grpo() -> None:
    config = get_recipe("qwenimage_pickscore")
    s, a, t, o = config.sampler, config.algorithm, config.train, config.optim
    assert (config.policy.name, config.policy.pretrained) == ("qwenimage", "Qwen/Qwen-Image")
    assert (config.policy.kwargs["height"], config.policy.kwargs["width"]) == (512, 512)
    assert config.policy.dtype == "bfloat16" and t.mixed_precision == "bf16"
    assert config.policy.gradient_checkpointing
    assert (s.num_steps, s.eval_num_steps, s.guidance_scale, s.noise_level) == (10, 50, 4.0, 1.2)
    assert (s.sde_window_size, s.sde_window_range) == (2, [0, 5])
    assert (a.kl_beta, a.clip_range, a.advantage_clip, a.std_mode) == (0.0, 1e-4, 5.0, "global")
    assert a.timestep_fraction == 1.0
    assert (t.prompts_per_iteration, t.group_size, t.minibatch_size) == (32, 16, 4)
    assert (o.lr, o.weight_decay, o.betas, o.eps, o.max_grad_norm) == (
        3e-4, 1e-4, [0.9, 0.999], 1e-8, 1.0,
    )  # fmt: skip
    assert o.ema_decay is None  # train.ema = False
    assert (config.eval.every, config.eval.batch_size, config.logging.checkpoint_every) == (
        30, 4, 30,
    )  # fmt: skip
    assert config.reward[0].name == "pickscore"


def test_qwenimage_ocr_follows_verl_omni() -> None:
    config = get_recipe("qwenimage_ocr")
    s, a, t = config.sampler, config.algorithm, config.train
    assert config.policy.lora_target_modules == VERL_OMNI_QWEN_LORA_TARGETS
    assert (config.policy.lora_rank, config.policy.lora_alpha) == (64, 128)
    assert config.policy.kwargs["lora_init"] == "gaussian"
    assert config.policy.kwargs["max_sequence_length"] == 256
    assert (a.clip_range, a.kl_beta, a.advantage_clip, a.std_mode) == (1e-5, 0.0, 5.0, "global")
    assert (s.num_steps, s.noise_level, s.guidance_scale) == (10, 1.2, 4.0)
    assert (s.sde_window_size, s.sde_window_range, s.eval_num_steps) == (2, [0, 5], 50)
    assert (t.prompts_per_iteration, t.group_size, t.minibatch_size, t.iterations) == (
        32, 16, 16, 300,
    )  # fmt: skip
    assert (config.optim.lr, config.optim.weight_decay, config.optim.max_grad_norm) == (
        3e-4, 1e-4, 1.0,
    )  # fmt: skip
    assert config.reward[0].name == "ocr" and config.prompts.dataset == "ocr_simple"


@pytest.mark.slow
def test_qwenimage_ocr_recipe_runs_on_tiny_stand_ins(tmp_path: Path) -> None:
    from accelerate.state import AcceleratorState
    from diffusers_tiny_families import build_qwenimage
    from test_ocr_reward import build_tiny_reader

    from genrl.loop.trainer import Trainer

    config = get_recipe("qwenimage_ocr")
    model = build_qwenimage(tmp_path / "qwenimage")
    reader = build_tiny_reader(tmp_path / "reader")
    kwargs = json.dumps({**config.policy.kwargs, "height": 32, "width": 32})
    config.apply_overrides(
        [
            f"policy.pretrained={model}",
            f"policy.kwargs={kwargs}",
            f'reward.0.kwargs={{"model": "{reader}", "max_new_tokens": 4}}',
            f"output_dir={tmp_path / 'run'}",
            "policy.dtype=float32",
            "train.mixed_precision=no",
            "train.iterations=1",
            "train.prompts_per_iteration=2",
            "train.group_size=2",
            "train.minibatch_size=2",
            "train.gradient_accumulation_steps=1",
            "train.rollout_batch_size=4",
            "sampler.num_steps=4",
            "sampler.sde_window_range=[0, 2]",
            "eval.samples_per_prompt=1",
            "sampler.eval_num_steps=3",
            "logging.tensorboard=false",
            "logging.progress_bar=false",
        ]
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        metrics = Trainer(config).train_iteration()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert metrics["loss/first_minibatch_ratio_deviation"] == 0.0
    assert metrics["optimizer_steps"] >= 1
    assert math.isfinite(metrics["ocr/mean"]) and math.isfinite(metrics["loss/total"])
