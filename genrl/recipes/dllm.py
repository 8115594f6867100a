"""Recipes for masked-diffusion LMs: the embedded 4x4 Sudoku task (CPU, minutes)."""

from __future__ import annotations

from genrl.algorithms.mask_grpo import MaskGRPOConfig
from genrl.run.config import (
    EvalConfig,
    OptimConfig,
    PolicyConfig,
    PromptConfig,
    RewardSpec,
    TrainConfig,
    TrainLoopConfig,
    UnmaskingConfig,
)


def dllm_sudoku_maskgrpo() -> TrainConfig:
    """MaskGRPO on the embedded 288k-parameter Sudoku dLLM.

    16-cell completions revealed one token per step by low-confidence remasking at temperature
    1; two fading-mask views per sample (ratios 0.8, 0.999), 16 prompts x 8, lr 2e-4 cosine,
    beta 0.04, 150 iterations. Reward: fraction of blanks right plus 1 for a solved grid (the
    last wrong cell costs more than the others). Held-out metric: solved rate of sampled
    completions at the training temperature, 4 per puzzle on 200 puzzles (pass@1 averaged over
    4 samples, as DeepSeek-R1 reports accuracy); ``benchmarks/dllm_estimators.py`` also
    measures greedy decoding.

    Measured (``benchmarks/dllm_estimators.py``, seeds 0/1/2, 468-496 s with two runs sharing 2
    cores): sampled solved 0.33 -> 0.485 / 0.495 / 0.450, greedy 0.49 -> 0.580 / 0.600 / 0.525;
    details in ``docs/algorithms/mask_grpo.md``. From the sweep (seed 0): the
    plain cell reward with lr 1e-4 over 90 iterations reached sampled pass@1 0.33 -> 0.41 (seed 1:
    0.445) and greedy 0.49 -> 0.54; the solved bonus with lr 1e-4 over 150 iterations 0.46;
    lr 3e-4 without the bonus first dropped the held-out reward and ended below the base.
    """
    return TrainConfig(
        recipe="dllm_sudoku_maskgrpo",
        seed=0,
        policy=PolicyConfig(name="sudoku_dllm"),
        generation=UnmaskingConfig(
            max_new_tokens=16, diffusion_steps=16, temperature=1.0, eval_temperature=1.0
        ),
        reward=[RewardSpec(name="sudoku", kwargs={"solved_bonus": 1.0})],
        algorithm=MaskGRPOConfig(num_iterations=2, kl_beta=0.04),
        prompts=PromptConfig(dataset="sudoku"),
        train=TrainLoopConfig(
            iterations=150, prompts_per_iteration=16, group_size=8, minibatch_size=128
        ),
        optim=OptimConfig(lr=2e-4, weight_decay=0.0, max_grad_norm=1.0, lr_schedule="cosine"),
        eval=EvalConfig(every=25, samples_per_prompt=4, batch_size=200),
    )


def dllm_sudoku_d1() -> TrainConfig:
    """diffu-GRPO (d1) on the same task with the MaskGRPO recipe's shared settings (reward,
    16 x 8, lr 2e-4 cosine, 150 iterations, sampled held-out metric): one-step estimator, d1's
    clip 0.5, beta 0.04 and unnormalised advantages; two views instead of d1's twelve to fit
    the CPU budget. Measured (seeds 0/1/2): sampled solved 0.33 -> 0.305 / 0.303 / 0.330,
    greedy 0.49 -> 0.470 / 0.460 / 0.490 (MaskGRPO: +0.15); see ``docs/algorithms/mask_grpo.md``.
    """
    config = dllm_sudoku_maskgrpo()
    config.recipe = "dllm_sudoku_d1"
    config.set_algorithm(MaskGRPOConfig.d1(num_iterations=2))
    return config


def llada8b_countdown_maskgrpo() -> TrainConfig:
    """MaskGRPO on LLaDA-8B-Instruct with LoRA, on Countdown through its chat template (GPUs).

    Settings from MaskGRPO's text recipe (github.com/martian422/MaskGRPO @ b74ba3c,
    ``scripts/train/t2t_grpo_train.sh`` over ``configs/rl.yaml``, ``grpo/grpo_config.py`` for the
    rest, ``grpo/mask_grpo_train.py``): LoRA rank 128 / alpha 64 on the script's targets
    (``q_proj k_proj v_proj o_proj up_proj down_proj gate_proj``, L169-175; on LLaDA's blocks only
    ``q/k/v_proj`` and ``up_proj`` exist, so its ``attn_out``, ``ff_proj``, ``ff_out`` and the
    output head stay frozen), lr 3e-6 constant after a one-step warm-up (``warmup_ratio`` 1e-4
    of 8000 steps), AdamW betas (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, bf16;
    256-token completions in 128 steps over blocks of 16, low-confidence remasking at
    temperature 0.9 (``grpo_config.py`` L193-198; neither file sets it); 12 views per sample
    (mu) with mask-ratio floor 0.6 and fading-out masking, clip 0.2, beta 0.01, k3 KL to the
    adapter-disabled base; advantages ``(r - mean) / (std + 1e-5)`` (Bessel) per group of 6,
    one token mean over each local minibatch (``bnpo``); 8 processes x 6 samples x 2
    accumulation steps per optimizer step, i.e. 16 prompts x 6 and 12 optimizer steps per
    iteration on 8 processes (minibatches of 6 views); 667 iterations = the reference's 8000
    optimizer steps; seed 42. Their task is GSM8K; this recipe uses the embedded
    ``countdown_chat`` prompts and the ``<answer>`` tag reward (d1 also trains LLaDA on
    Countdown). LLaDA's modelling code is the checkpoint's own, hence ``trust_remote_code``;
    its tokenizer does not name the mask token (id 126336).

    Remaining differences: LoRA dropout 0.05 there (genrl turns dropout off so that the first
    update is on-policy); the reference's optimizer step takes one view index for all its
    samples (with accumulation 2, micro-batch 0 cycles through the even views and 1 through the
    odd ones), genrl shuffles (sample, view) units; ``max_prompt_length`` 256 (prompts are not
    truncated here); its ``sync_ref_model`` is a no-op with LoRA, as here. Held-out evaluation
    decodes greedily (the reference evaluates outside training).

    Not run here (no GPU was available); trained on a tiny stand-in in
    ``tests/test_masked_lm.py``.
    """
    return TrainConfig(
        recipe="llada8b_countdown_maskgrpo",
        seed=42,
        policy=PolicyConfig(
            name="masked_lm",
            pretrained="GSAI-ML/LLaDA-8B-Instruct",
            lora_rank=128,
            lora_alpha=64,
            lora_target_modules=[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "up_proj",
                "down_proj",
                "gate_proj",
            ],
            dtype="bfloat16",
            kwargs={"trust_remote_code": True, "chat_template": True, "mask_token_id": 126336},
        ),
        generation=UnmaskingConfig(
            max_new_tokens=256,
            diffusion_steps=128,
            block_length=16,
            remasking="low_confidence",
            temperature=0.9,
        ),
        reward=[RewardSpec(name="countdown", kwargs={"answer_tags": True})],
        algorithm=MaskGRPOConfig(
            num_iterations=12,
            mask_ratio_floor=0.6,
            clip_range=0.2,
            kl_beta=0.01,
            aggregation="bnpo",
            std_mode="group",
            std_estimator="sample",
            std_eps=1e-5,
        ),
        prompts=PromptConfig(dataset="countdown_chat"),
        train=TrainLoopConfig(
            iterations=667,
            prompts_per_iteration=16,
            group_size=6,
            minibatch_size=6,
            gradient_accumulation_steps=2,
            mixed_precision="bf16",
        ),
        optim=OptimConfig(
            lr=3e-6,
            betas=[0.9, 0.99],
            weight_decay=0.1,
            max_grad_norm=0.2,
            lr_schedule="constant",
            warmup_steps=1,
        ),
        eval=EvalConfig(every=50, samples_per_prompt=1, batch_size=16),
    )


DLLM_RECIPES = {
    "dllm_sudoku_maskgrpo": dllm_sudoku_maskgrpo,
    "dllm_sudoku_d1": dllm_sudoku_d1,
    "llada8b_countdown_maskgrpo": llada8b_countdown_maskgrpo,
}
