"""Recipes for masked image-token generators: MaskGRPO on aMUSEd (GPU, hub weights) and on the
compositional task's embedded aMUSEd pipeline (CPU)."""

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

AMUSED_256 = "amused/amused-256"


def amused256_maskgrpo_hps() -> TrainConfig:
    """MaskGRPO on aMUSEd-256 with LoRA against HPSv2.1 (GPUs).

    Settings from MaskGRPO's image recipe (github.com/martian422/MaskGRPO @ b74ba3c,
    ``scripts/train/t2i_grpo_train.sh`` over ``configs/rl.yaml``, the trainer's
    ``t2i_generate_emerge`` and ``remask_t2i`` in ``grpo/mask_grpo_trainer.py``), there on
    MMaDA-8B: images sampled by the emerge sampler in its default 12 steps at temperature 1
    (cosine mask rates); classifier-free guidance 3.0 under MMaDA's rule
    ``(1 + g) cond - g uncond``, which is aMUSEd's ``uncond + g' (cond - uncond)`` with
    ``g' = 4``; 6 views per sample (``NUM_ITER``) with each image token re-masked with
    probability ``t_j = min(0.6 + 0.4 (j + 1) / 6, 0.999)`` (``--min_mask_rate 0.6``; its
    reward-server script uses 0.8), the re-masked tokens scored by the conditional model
    without guidance, as there; clip 0.2, beta 0.01 (k3, adapter-disabled reference),
    advantages ``(r - mean) / (std + 1e-5)`` (Bessel) per group of 9 (``MULTI * PER_DEVICE_BS``),
    one token mean per minibatch (``bnpo``); LoRA rank 128 / alpha 64, lr 3e-6 constant after
    one warm-up step, AdamW betas (0.9, 0.99), weight decay 0.1, grad-norm clip 0.2, bf16,
    seed 42. Batches: the script's 6 processes x 3 samples x 2 accumulation steps make 4
    prompts x 9 images per sampling round and 6 optimizer steps of 36 units (one view each);
    genrl's batch must divide over 1, 2, 4 and 8 processes, so here 8 prompts x 9 per
    iteration and, on 8 processes, minibatches of 3 views with 3 accumulation steps: the same 6
    optimizer steps per iteration, of 72 units. 1333 iterations = the script's 8000 optimizer
    steps.

    Differences: aMUSEd-256 (256 px, 16 x 16 tokens, 8192 codes; CLIP-L/14 text encoder)
    instead of MMaDA-8B (512 px, 1024 tokens of a MAGVIT-v2 codebook in the LM's vocabulary);
    HPSv2.1 (the script's mark; its active reward is UnifiedReward through a server, HPSv2 the
    commented alternative) on the bundled ``t2i_simple`` prompts instead of their portrait
    prompt set; LoRA on aMUSEd's attention projections instead of the LM's. The reference's
    optimizer step takes one view index for all its samples; genrl shuffles (sample, view)
    units. Held-out images: the emerge sampler at temperature 1, seeded by position.

    Not run here (no GPU was available); trained on the tiny random aMUSEd in
    ``tests/test_amused.py``.
    """
    return TrainConfig(
        recipe="amused256_maskgrpo_hps",
        seed=42,
        policy=PolicyConfig(
            name="amused",
            pretrained=AMUSED_256,
            lora_rank=128,
            lora_alpha=64,
            dtype="bfloat16",
            kwargs={"guidance_scale": 4.0},
        ),
        generation=UnmaskingConfig(
            sampler="emerge",
            max_new_tokens=256,
            diffusion_steps=12,
            temperature=1.0,
            eval_temperature=1.0,
        ),
        reward=[RewardSpec(name="hps")],
        algorithm=MaskGRPOConfig(
            num_iterations=6,
            mask_ratio_floor=0.6,
            view_masking="uniform",
            clip_range=0.2,
            kl_beta=0.01,
            aggregation="bnpo",
            std_mode="group",
            std_estimator="sample",
            std_eps=1e-5,
        ),
        prompts=PromptConfig(dataset="t2i_simple"),
        train=TrainLoopConfig(
            iterations=1333,
            prompts_per_iteration=8,
            group_size=9,
            minibatch_size=3,
            gradient_accumulation_steps=3,
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
        eval=EvalConfig(every=100, samples_per_prompt=4, batch_size=16),
    )


def compositional_discrete_maskgrpo() -> TrainConfig:
    """MaskGRPO on the compositional task's embedded aMUSEd pipeline (``policy.name=
    compositional_discrete``: a 32x32 VQ tokenizer with 64 codes, an 8x8 token grid, a tiny CLIP
    text encoder and U-ViT; ``scripts/build_discrete_assets.py``), full fine-tuning of the U-ViT
    against the ``compositional`` reward on the task's training prompts.

    The image recipe above on a CPU budget: the emerge sampler (8 steps, temperature 1), guidance
    2 (aMUSEd's rule), uniform views with re-mask probability ``t_j = 0.6 + 0.4 (j + 1) / 2``
    (2 views per sample), clip 0.2, no KL, advantages ``(r - mean) / (std + 1e-5)`` per group
    of 8, one token mean per minibatch (``bnpo``); 16 prompts x 8 images per iteration.
    Held-out evaluation: ``heldout_prompts()`` (25) x 8 samples of the emerge sampler at
    temperature 1, seeded by position, every 10 iterations.

    Measured (seed 0, ``OMP_NUM_THREADS=2`` on a 2-core machine shared with three other jobs):
    held-out 0.095 -> 0.200 (+0.105) after 60 iterations in 1,042 s (best 0.210 at iteration
    30, under 10 minutes in); canvases fill up (objects 2.17 -> 3.53), as in
    ``compositional_flow_grpo``.
    """
    return TrainConfig(
        recipe="compositional_discrete_maskgrpo",
        seed=0,
        policy=PolicyConfig(name="compositional_discrete", kwargs={"guidance_scale": 2.0}),
        generation=UnmaskingConfig(
            sampler="emerge",
            max_new_tokens=64,
            diffusion_steps=8,
            temperature=1.0,
            eval_temperature=1.0,
        ),
        reward=[RewardSpec(name="compositional")],
        algorithm=MaskGRPOConfig(
            num_iterations=2,
            mask_ratio_floor=0.6,
            view_masking="uniform",
            clip_range=0.2,
            kl_beta=0.0,
            aggregation="bnpo",
            std_mode="group",
            std_estimator="sample",
            std_eps=1e-5,
        ),
        prompts=PromptConfig(dataset="compositional"),
        train=TrainLoopConfig(
            iterations=60, prompts_per_iteration=16, group_size=8, minibatch_size=64
        ),
        optim=OptimConfig(lr=3e-4, weight_decay=0.0, max_grad_norm=1.0),
        eval=EvalConfig(every=10, samples_per_prompt=8, seed=1234),
    )


def compositional_discrete_d1() -> TrainConfig:
    """diffu-GRPO (d1) on the same embedded pipeline with ``compositional_discrete_maskgrpo``'s
    shared settings (reward, emerge rollouts, 16 x 8, lr 3e-4, 60 iterations, held-out
    protocol): d1's one-step estimator (every image token masked, one forward, the mean-field
    log-prob per token), clip 0.5, beta 0.04 and advantages without the std; two passes instead
    of d1's twelve, as ``dllm_sudoku_d1``, to fit the CPU budget. CLIP has no mask token, so
    d1's masking of prompt tokens is off. ``benchmarks/dllm_estimators.py --task
    compositional_discrete`` compares the two (``docs/algorithms/mask_grpo.md``).
    """
    config = compositional_discrete_maskgrpo()
    config.recipe = "compositional_discrete_d1"
    config.set_algorithm(MaskGRPOConfig.d1(num_iterations=2))
    return config


MASKED_IMAGE_RECIPES = {
    "amused256_maskgrpo_hps": amused256_maskgrpo_hps,
    "compositional_discrete_maskgrpo": compositional_discrete_maskgrpo,
    "compositional_discrete_d1": compositional_discrete_d1,
}
