"""Recipes for token policies: the embedded Countdown task (CPU, minutes) and a real LLM."""

from __future__ import annotations

from genrl.algorithms.grpo import GRPOConfig
from genrl.config import (
    EvalConfig,
    GenerationConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    TrainConfig,
    TrainLoopConfig,
)


def llm_countdown_grpo() -> TrainConfig:
    """GRPO on the embedded 308k-parameter Countdown LM (held-out greedy accuracy 0.37).

    The completion is at most 7 characters plus the end token, hence 8 new tokens; groups of 8
    at temperature 1 (the base model's pass@8 is 0.83, so most groups hold a correct answer).
    """
    return TrainConfig(
        recipe="llm_countdown_grpo",
        seed=0,
        policy=PolicyConfig(name="countdown_lm"),
        generation=GenerationConfig(max_new_tokens=8, temperature=1.0),
        reward=[RewardSpec(name="countdown")],
        algorithm=GRPOConfig(clip_range=0.2, aggregation="sequence_mean", kl_beta=0.0),
        prompts=PromptConfig(dataset="countdown"),
        train=TrainLoopConfig(
            iterations=60, prompts_per_iteration=32, group_size=8, minibatch_size=64
        ),
        optim=OptimConfig(lr=3e-4, weight_decay=0.0, max_grad_norm=1.0),
        eval=EvalConfig(every=10, samples_per_prompt=1, batch_size=200),
    )


def qwen3_countdown_grpo() -> TrainConfig:
    """Qwen3-0.6B with LoRA on the same task through its chat template (a GPU job).

    Settings follow TRL's GRPO defaults (clip 0.2, beta 0, temperature 1, lr 1e-6 for full
    fine-tuning; LoRA takes ~1e-5) with DAPO's token-mean loss and clip-higher 0.28.
    """
    config = llm_countdown_grpo()
    config.recipe = "qwen3_countdown_grpo"
    config.policy = PolicyConfig(
        name="causal_lm",
        pretrained="Qwen/Qwen3-0.6B",
        lora_rank=16,
        lora_alpha=32,
        dtype="bfloat16",
        kwargs={"chat_template": True},
    )
    config.generation = GenerationConfig(max_new_tokens=256, temperature=1.0)
    config.algorithm = GRPOConfig(clip_range=0.2, clip_range_high=0.28, aggregation="token_mean")
    config.train = TrainLoopConfig(
        iterations=200,
        prompts_per_iteration=32,
        group_size=8,
        minibatch_size=16,
        gradient_accumulation_steps=4,
        mixed_precision="bf16",
    )
    config.optim = OptimConfig(lr=1e-5, weight_decay=0.0, max_grad_norm=1.0)
    config.eval = EvalConfig(every=20, samples_per_prompt=1, batch_size=64)
    return config


TEXT_RECIPES = {
    "llm_countdown_grpo": llm_countdown_grpo,
    "qwen3_countdown_grpo": qwen3_countdown_grpo,
}
