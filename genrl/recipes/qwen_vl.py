"""Recipes for real vision-language models (need GPUs and the hub weights).

EasyR1's Geometry3K GRPO recipes (hiyouga/EasyR1 at b44b311): ``examples/config.yaml`` with
``examples/qwen2_5_vl_3b_geo3k_grpo.sh`` (2 GPUs) and ``qwen2_5_vl_7b_geo3k_grpo.sh`` (8 GPUs),
which change only the model, the data (``hiyouga/geometry3k`` train/test) and the GPU count.
From the config and the actor defaults (``verl/workers/actor/config.py``,
``verl/trainer/core_algos.py``): 512 prompts x 5 samples per rollout, temperature 1, top-p 1;
2048 prompt and 2048 response tokens; one pass, optimizer steps of 128 prompts x 5 (4 per
rollout); AdamW lr 1e-6, weight decay 1e-2, betas (0.9, 0.999), no warm-up, grad norm 1; KL as
a loss with the low-variance (k3) estimator, coefficient 1e-2; clip 0.2 / 0.3 with dual clip 3;
token-mean loss; group advantages with the sample std and eps 1e-6; the vision tower trained
too (``freeze_vision_tower: false``); 15 epochs; the reward of ``examples/reward_function/
math.py`` (0.9 accuracy + 0.1 format, genrl ``math_boxed``) on prompts formatted by
``examples/format_prompt/math.jinja``. EasyR1 reports Geometry3K test accuracy 0.24 -> 0.38
(3B) and 0.37 -> 0.48 (7B) for these recipes (its ``assets/baselines.md``).

Data: ``python scripts/geometry3k_jsonl.py geometry3k`` writes ``geometry3k/train.jsonl`` and
``test.jsonl`` (with the format sentence) from the hub once; the recipes read them.

Remaining differences, shared: images at the processor's own size limits (EasyR1: 512^2 to
2048^2 pixels); no filter of prompts over 2048 tokens; held-out decoding at temperature 0.6
without top-p 0.95 (genrl's evaluation has no top-p); EasyR1 samples with vLLM and trains with
FSDP on bf16 compute over float32 weights, as ``train.mixed_precision=bf16`` with float32
weights does here. Not run here (no GPU).
"""

from __future__ import annotations

from genrl.algorithms.grpo import GRPOConfig
from genrl.run.config import (
    EvalConfig,
    GenerationConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    TrainConfig,
    TrainLoopConfig,
)


def qwen25vl_3b_geo_grpo() -> TrainConfig:
    """Qwen2.5-VL-3B-Instruct on Geometry3K with EasyR1's GRPO recipe (module docstring), every
    weight trained, vision tower included. Batch layout for 2 processes as the reference: 512
    prompts x 5 per iteration, minibatch 4 x 80 accumulated = 640 samples per optimizer step
    over both processes, 4 steps per iteration; 15 epochs of 2,101 problems are 60 iterations."""
    return TrainConfig(
        recipe="qwen25vl_3b_geo_grpo",
        policy=PolicyConfig(
            name="vlm",
            pretrained="Qwen/Qwen2.5-VL-3B-Instruct",
            dtype="float32",
            gradient_checkpointing=True,
            kwargs={"train_vision": True},
        ),
        generation=GenerationConfig(
            max_new_tokens=2048, temperature=1.0, top_p=1.0, eval_temperature=0.6
        ),
        reward=[RewardSpec(name="math_boxed", kwargs={"format_weight": 0.1})],
        algorithm=GRPOConfig(
            clip_range=0.2,
            clip_range_high=0.3,
            clip_ratio_c=3.0,
            aggregation="token_mean",
            std_mode="group",
            std_estimator="sample",
            std_eps=1e-6,
            kl_beta=0.01,
            kl_estimator="k3",
        ),
        prompts=PromptConfig(dataset="geometry3k"),
        train=TrainLoopConfig(
            iterations=60,
            prompts_per_iteration=512,
            group_size=5,
            minibatch_size=4,
            gradient_accumulation_steps=80,
            rollout_batch_size=64,
            mixed_precision="bf16",
        ),
        optim=OptimConfig(lr=1e-6, weight_decay=1e-2, betas=[0.9, 0.999], max_grad_norm=1.0),
        eval=EvalConfig(every=5, samples_per_prompt=1, batch_size=64),
        logging=LoggingConfig(checkpoint_every=5, log_every=1),
    )


def qwen25vl_7b_geo_grpo() -> TrainConfig:
    """Qwen2.5-VL-7B-Instruct with the 3B recipe's settings on 8 processes, as EasyR1's 7B
    script: minibatch 4 x 20 accumulated x 8 processes = 640 samples per optimizer step."""
    config = qwen25vl_3b_geo_grpo()
    config.recipe = "qwen25vl_7b_geo_grpo"
    config.policy.pretrained = "Qwen/Qwen2.5-VL-7B-Instruct"
    config.train.gradient_accumulation_steps = 20
    return config


def qwen25vl_7b_geo_grpo_lora() -> TrainConfig:
    """The 7B recipe on one GPU: LoRA rank 64 / alpha 64 on the language model (EasyR1's LoRA
    settings: ``lora.alpha: 64`` in ``config.yaml``, rank 64 and lr 1e-5 in
    ``examples/qwen3_vl_4b_geo3k_grpo_lora.sh``; its LoRA excludes ``.*visual.*``), bf16 frozen
    weights, 64 prompts x 5 per iteration with 4 optimizer steps (minibatch 4 x 20), 480
    iterations for the reference's 15 epochs. The batch scaling is genrl's choice."""
    config = qwen25vl_7b_geo_grpo()
    config.recipe = "qwen25vl_7b_geo_grpo_lora"
    config.policy.lora_rank, config.policy.lora_alpha = 64, 64
    config.policy.dtype = "bfloat16"
    config.policy.kwargs = {"train_vision": False}
    config.optim.lr = 1e-5
    config.train.prompts_per_iteration = 64
    config.train.iterations = 480
    config.eval.every = 40
    config.logging.checkpoint_every = 40
    return config


QWEN_VL_RECIPES = {
    "qwen25vl_3b_geo_grpo": qwen25vl_3b_geo_grpo,
    "qwen25vl_7b_geo_grpo": qwen25vl_7b_geo_grpo,
    "qwen25vl_7b_geo_grpo_lora": qwen25vl_7b_geo_grpo_lora,
}
